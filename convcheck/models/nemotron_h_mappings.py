"""Explicit mappings of NemotronH (Mamba / attention / MLP / MoE hybrid): Megatron names -> HF names and the mapping
kind."""

from __future__ import annotations

import re

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Replicated, Split, mamba_conv1d, mamba_in_proj
from convcheck.mappings.registry import MappingRule
from convcheck.models.nemotron_h import EMBEDDING
from convcheck.models.shared_mappings import LAYER_PREFIX, expert_id, expert_weight, fused_qkv_rule, vocab_rows

"""The embedding's name in published NemotronH checkpoints (and the bridge's)."""


def hf_layer(match: re.Match[str], suffix: str) -> str:
    """HF name of `suffix` in the matched Megatron layer: backbone.layers.N.<suffix>."""
    return f"backbone.layers.{match['layer']}.{suffix}"


def mamba_sizes(geometry: Geometry) -> dict[str, int]:
    """The Mamba-2 mixer sizes the in_proj / conv1d mappings take."""
    return {
        "heads": geometry.mamba_heads,
        "head_dim": geometry.mamba_head_dim,
        "groups": geometry.mamba_groups,
        "state": geometry.mamba_state,
    }


LAYER_NORM = MappingRule(
    LAYER_PREFIX + r"(norm\.weight|input_layernorm\.weight|pre_mlp_layernorm\.weight|mixer\.in_proj\.layer_norm_weight"
    r"|self_attention\.linear_qkv\.layer_norm_weight|mlp\.linear_fc1\.layer_norm_weight)",
    lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "norm.weight")),
)
"""Every layer's single norm is HF `backbone.layers.N.norm.weight`, whichever Megatron module holds it (local spec:
`norm` / `input_layernorm` / `pre_mlp_layernorm`; TE spec: the fused linear's `layer_norm_weight`)."""
MAMBA_MIXER = (
    MappingRule(
        LAYER_PREFIX + r"mixer\.in_proj\.weight",
        lambda match, geometry: mamba_in_proj(
            megatron=match[0], hf=hf_layer(match, "mixer.in_proj.weight"), **mamba_sizes(geometry)
        ),
    ),
    MappingRule(
        LAYER_PREFIX + r"mixer\.conv1d[._](?P<kind>weight|bias)",
        lambda match, geometry: mamba_conv1d(
            megatron=match[0], hf=hf_layer(match, f"mixer.conv1d.{match['kind']}"), **mamba_sizes(geometry)
        ),
    ),
    MappingRule(
        LAYER_PREFIX + r"mixer\.(?P<param>A_log|D|dt_bias|norm\.weight)",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, f"mixer.{match['param']}")),
    ),
    MappingRule(
        LAYER_PREFIX + r"mixer\.out_proj\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "mixer.out_proj.weight"), dim=1),
    ),
)
ATTENTION = (
    fused_qkv_rule(LAYER_PREFIX, hf_layer, module="mixer"),
    MappingRule(
        LAYER_PREFIX + r"self_attention\.linear_proj\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "mixer.o_proj.weight"), dim=1),
    ),
)
MLP = (  # not gated: down(relu2(up(x)))
    MappingRule(
        LAYER_PREFIX + r"mlp\.linear_fc1\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "mixer.up_proj.weight")),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.linear_fc2\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "mixer.down_proj.weight"), dim=1),
    ),
)
MOE = (
    MappingRule(
        LAYER_PREFIX + r"mlp\.router\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "mixer.gate.weight")),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.router\.expert_bias",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, "mixer.gate.e_score_correction_bias")),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.shared_experts\.linear_fc1\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, "mixer.shared_experts.up_proj.weight")),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.shared_experts\.linear_fc2\.weight",
        lambda match, geometry: Split(
            megatron=match[0], hf=hf_layer(match, "mixer.shared_experts.down_proj.weight"), dim=1
        ),
    ),
    MappingRule(
        LAYER_PREFIX + expert_weight(1),
        lambda match, geometry: Split(
            megatron=match[0],
            axis="etp",
            expert=int(expert_id(match)),
            num_experts=geometry.num_experts,
            hf=hf_layer(match, f"mixer.experts.{expert_id(match)}.up_proj.weight"),
        ),
    ),
    MappingRule(
        LAYER_PREFIX + expert_weight(2),
        lambda match, geometry: Split(
            megatron=match[0],
            axis="etp",
            dim=1,
            expert=int(expert_id(match)),
            num_experts=geometry.num_experts,
            hf=hf_layer(match, f"mixer.experts.{expert_id(match)}.down_proj.weight"),
        ),
    ),
)


def hybrid_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of a NemotronH HybridModel (tied: the output layer copies the embedding)."""
    return [
        MappingRule(
            r"embedding\.word_embeddings\.weight", lambda match, geometry: vocab_rows(match[0], EMBEDDING, geometry)
        ),
        MappingRule(
            r"output_layer\.weight",
            lambda match, geometry: vocab_rows(match[0], EMBEDDING if tied else "lm_head.weight", geometry),
        ),
        MappingRule(
            r"decoder\.(final_norm|final_layernorm)\.weight",
            lambda match, geometry: Replicated(megatron=match[0], hf="backbone.norm_f.weight"),
        ),
        LAYER_NORM,
        *MAMBA_MIXER,
        *ATTENTION,
        *MLP,
        *MOE,
    ]
