"""Quantized refit: the reference quantizers (catalog: names and arithmetic, no torch; reference, quantizer: rank side)
and the name-set logic of a target's quantization_config (names). docs/quant.md says what the quant oracle proves."""

from convcheck.quant.catalog import FORMATS, QuantFormat, is_custom, parse_block, parse_quantizer
from convcheck.quant.names import QuantTarget, expected_quantized, matches, over_matches, target_from_config

__all__ = [
    "FORMATS",
    "QuantFormat",
    "QuantTarget",
    "expected_quantized",
    "is_custom",
    "matches",
    "over_matches",
    "parse_block",
    "parse_quantizer",
    "target_from_config",
]
