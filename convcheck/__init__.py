"""convcheck: prove Megatron-Core <-> Hugging Face weight conversions correct, bit for bit.

Library use: `convcheck.verify("tiny:qwen3-moe", "tp2ep2") -> Report` (the CLI, benches and plugin call it).
"""

from convcheck.api import prepare, resolve_model, run, verify
from convcheck.errors import BadInput, ConvcheckError, SetupError
from convcheck.layout import ParallelLayout, RankCoord
from convcheck.verdict import Finding, OracleVerdict, Report

__all__ = [
    "BadInput",
    "ConvcheckError",
    "Finding",
    "OracleVerdict",
    "ParallelLayout",
    "RankCoord",
    "Report",
    "SetupError",
    "prepare",
    "resolve_model",
    "run",
    "verify",
]
