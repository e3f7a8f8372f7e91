"""The shapes config.json implies for the HF tensors decoder-only families name alike, checked before any rank starts.

Only names whose shape follows from the config in every family are checked (embeddings, norms, attention and MLP
projections, routed experts); any other tensor passes. A tensor with no elements is never a model weight.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from convcheck.errors import BadInput
from convcheck.hf.geometry import Geometry

_LAYER = r"(?:model\.|model\.language_model\.|language_model\.model\.|backbone\.)?layers\.(?P<layer>\d+)\."
Dim = tuple[str, Callable[[Geometry, int], int]]
"""(config field, its value in the geometry for a 0-based layer, -1 outside the layers); a value of 0 means the
config does not say, so any size passes."""
_HIDDEN: Dim = ("hidden_size", lambda g, _layer: g.hidden)
_VOCAB: Dim = ("vocab_size", lambda g, _layer: g.vocab)
_FFN: Dim = ("intermediate_size", lambda g, layer: g.ffn_of(layer))
_MOE_FFN: Dim = ("moe_intermediate_size", lambda g, _layer: g.moe_ffn)
_EXPERTS: Dim = ("num_experts", lambda g, _layer: g.num_experts)
_ANY: Dim = ("", lambda g, _layer: 0)


@dataclass(frozen=True, slots=True)
class ShapeRule:
    """Tensors whose full name matches `pattern` have one dimension per entry of `dims`."""

    pattern: str
    dims: tuple[Dim, ...]
    stored_otherwise: tuple[str, ...] = ()
    """model_types whose published checkpoints store the tensor in another layout, which transformers converts on
    load (its conversion_mapping.py): the rule does not apply to them."""


RULES: tuple[ShapeRule, ...] = (
    ShapeRule(
        r"(?:model\.(?:language_model\.)?|language_model\.model\.)?embed_tokens\.weight|backbone\.embeddings?\.weight"
        r"|(?:language_model\.)?lm_head\.weight",
        (_VOCAB, _HIDDEN),
    ),
    ShapeRule(_LAYER + r"(?:input_layernorm|post_attention_layernorm)\.weight", (_HIDDEN,)),
    ShapeRule(
        r"(?:model\.|model\.language_model\.|language_model\.model\.)norm\.weight|backbone\.norm_f\.weight", (_HIDDEN,)
    ),
    ShapeRule(_LAYER + r"(?:self_attn|mixer)\.[qkv]_proj\.weight", (_ANY, _HIDDEN)),
    ShapeRule(_LAYER + r"(?:self_attn|mixer)\.o_proj\.weight", (_HIDDEN, _ANY)),
    ShapeRule(_LAYER + r"mlp\.(?:gate|up)_proj\.weight", (_FFN, _HIDDEN)),
    ShapeRule(_LAYER + r"mlp\.down_proj\.weight", (_HIDDEN, _FFN)),
    ShapeRule(_LAYER + r"mlp\.experts\.\d+\.(?:gate|up)_proj\.weight", (_MOE_FFN, _HIDDEN)),
    ShapeRule(_LAYER + r"mlp\.experts\.\d+\.down_proj\.weight", (_HIDDEN, _MOE_FFN)),
    # Ernie 4.5 VL stores the router [hidden, experts]; transformers transposes it on load (conversion_mapping.py,
    # "ernie4_5_vl_moe": mlp.gate.weight -> mlp.text_moe.gate.weight, Transpose(0, 1)).
    ShapeRule(_LAYER + r"mlp\.gate\.weight", (_EXPERTS, _HIDDEN), stored_otherwise=("ernie4_5_vl_moe",)),
)
_COMPILED = tuple((re.compile(rule.pattern), rule) for rule in RULES)


def expected_shape(name: str, geometry: Geometry, model_type: str = "") -> tuple[tuple[int, ...], str] | None:
    """(implied shape, 0 where free; the config fields it follows from) for tensor `name` of a checkpoint of
    `model_type`, None when no rule applies."""
    for pattern, rule in _COMPILED:
        if model_type in rule.stored_otherwise:
            continue
        if match := pattern.fullmatch(name):
            layer = int(match["layer"]) if "layer" in pattern.groupindex else -1
            sizes = tuple(value(geometry, layer) for _, value in rule.dims)
            fields = ", ".join(f"{field}={size}" for (field, _), size in zip(rule.dims, sizes, strict=True) if field)
            return sizes, fields
    return None


def check_config_shapes(config: dict[str, Any], tensors: Mapping[str, Any]) -> None:
    """BadInput naming the file and the tensor when a tensor is empty or its shape contradicts config.json (every
    offender is collected; the line names the first and counts the others). `tensors`: name -> entry with `.shape`
    and `.file` (convcheck.hf.checkpoint.TensorEntry)."""
    geometry = Geometry.from_hf_config(config)
    problems = []
    for name in sorted(tensors):
        entry = tensors[name]
        if 0 in entry.shape:
            problems.append(
                f"tensor {name!r} in {entry.file} has no elements (shape {list(entry.shape)}); a model weight is "
                f"never empty"
            )
            continue
        implied = expected_shape(name, geometry, str(config.get("model_type", "")))
        if implied is None:
            continue
        sizes, fields = implied
        fits = len(sizes) == len(entry.shape) and all(s in (0, d) for s, d in zip(sizes, entry.shape, strict=False))
        if not fits:
            shown = "[" + ", ".join(str(s) if s else "*" for s in sizes) + "]"
            problems.append(
                f"config/weights shape mismatch: tensor {name!r} in {entry.file} has shape {list(entry.shape)}, "
                f"but config.json ({fields}) implies {shown}"
            )
    if problems:
        more = f" (and {len(problems) - 1} more tensor(s) like it)" if len(problems) > 1 else ""
        raise BadInput(problems[0] + more)
