"""GPT-OSS explicit mappings: every Megatron parameter of its attention (q/k/v/o biases, per-head sinks), router
(weight and bias) and biased experts, whose HF tensors are fused per layer with gate and up interleaved
(convcheck.mappings.interleaved_experts)."""

from __future__ import annotations

import re

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Gated, Replicated, Split
from convcheck.mappings.interleaved_experts import ExpertBias, InterleavedSlice
from convcheck.mappings.registry import MappingRule
from convcheck.models.dense_mappings import EMBEDDING_AND_FINAL_NORM, LAYER_NORMS, hf_layer, output_layer
from convcheck.models.shared_mappings import LAYER_PREFIX, fused_qkv_rule


def _replicated(pattern: str, suffix: str) -> MappingRule:
    return MappingRule(LAYER_PREFIX + pattern, lambda m, _g: Replicated(megatron=m[0], hf=hf_layer(m, suffix)))


ATTENTION = (
    fused_qkv_rule(LAYER_PREFIX, hf_layer, bias=True),
    MappingRule(  # row parallel: [hidden, heads * head_dim / tp]
        LAYER_PREFIX + r"self_attention\.linear_proj\.weight",
        lambda m, _g: Split(megatron=m[0], hf=hf_layer(m, "self_attn.o_proj.weight"), dim=1),
    ),
    _replicated(r"self_attention\.linear_proj\.bias", "self_attn.o_proj.bias"),  # [hidden], added after the reduce
    MappingRule(  # [heads / tp]: one sink per local head (dot_product_attention.py:126-132)
        LAYER_PREFIX + r"self_attention\.core_attention\.softmax_offset",
        lambda m, _g: Split(megatron=m[0], hf=hf_layer(m, "self_attn.sinks"), dim=0),
    ),
    _replicated(r"mlp\.router\.weight", "mlp.router.weight"),  # [E, hidden]
    _replicated(r"mlp\.router\.bias", "mlp.router.bias"),  # [E]
)

EXPERT = (
    r"mlp\.experts\.(local_experts\.(?P<local>\d+)\.linear_fc(?P<fc>[12])\.(?P<kind>weight|bias)"
    r"|linear_fc(?P<gfc>[12])\.(?P<gkind>weight|bias)(?P<grouped>\d+))"
)
"""One expert's parameter: SequentialMLP `local_experts.E.linear_fcN.{weight,bias}` or TE grouped
`linear_fcN.{weight,bias}E` (E global)."""


def expert_slice(match: re.Match[str], geometry: Geometry) -> InterleavedSlice:
    """Expert E's fc1 / fc2 weight or bias <-> slice [E] of the layer's fused gate_up_proj(_bias) / down_proj(_bias)."""
    expert = int(match["local"] or match["grouped"])
    fc, kind = match["fc"] or match["gfc"], match["kind"] or match["gkind"]
    projection = ("gate_up_proj" if fc == "1" else "down_proj") + ("_bias" if kind == "bias" else "")
    fused = hf_layer(match, f"mlp.experts.{projection}")
    owned = {"megatron": match[0], "axis": "etp", "expert": expert, "num_experts": geometry.num_experts}
    piece = f"{fused}[{expert}]"
    if fc == "1":
        inner = Gated(**owned, gate=f"{piece}.gate", up=f"{piece}.up")
    elif kind == "weight":
        inner = Split(**owned, dim=1, hf=piece)
    else:
        inner = ExpertBias(**owned, hf=piece)
    return InterleavedSlice(inner=inner, fused=fused, projection=projection)


EXPERTS = (MappingRule(LAYER_PREFIX + EXPERT, expert_slice),)


def gpt_oss_rules(tied: bool) -> list[MappingRule]:
    """The family's rule table (tied -> rules)."""
    return [*EMBEDDING_AND_FINAL_NORM, *LAYER_NORMS, *ATTENTION, *EXPERTS, output_layer(tied)]
