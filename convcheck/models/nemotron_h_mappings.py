"""Explicit mappings of NemotronH (Mamba / attention / MLP / MoE hybrid): Megatron names -> HF names and the mapping
kind.

MTP (Nemotron-3 Super): megatron-core holds block d of the MTP pattern (P layers, e.g. `*E`) as `mtp.layers.{d}`, its
inner layer i as `mtp.layers.{d}.mtp_model_layer.layers.{i}.*` with a decoder layer's names; published checkpoints
flatten it to `mtp.layers.{d * P + i}.*` with the decoder layer's HF names, the block's enorm / hnorm / eh_proj on
its first inner layer and its final_layernorm on its last (megatron-bridge nemotronh/nemotron_h_bridge.py
`_MTPFlatteningMapping`)."""

from __future__ import annotations

import re

from convcheck.hf.geometry import Geometry
from convcheck.mappings import FusedQKV, Replicated, Split, mamba_conv1d, mamba_in_proj
from convcheck.mappings.registry import MappingRule
from convcheck.models.nemotron_h import EMBEDDING
from convcheck.models.shared_mappings import expert_id, expert_weight, vocab_rows

LAYER_PREFIX = r"(decoder\.layers\.(?P<layer>\d+)|mtp\.layers\.(?P<mtp>\d+)\.mtp_model_layer\.layers\.(?P<inner>\d+))\."
"""A decoder layer (`layer`: its global number) or inner layer `inner` of MTP block `mtp`."""
MTP_BLOCK = r"mtp\.layers\.(?P<mtp>\d+)\."
"""An MTP block's own modules (enorm, hnorm, eh_proj, final_layernorm)."""


def mtp_index(block: int, inner: int, geometry: Geometry) -> int:
    """HF's flat MTP layer number of inner layer `inner` of MTP block `block`: block * P + inner, P the MTP pattern's
    length (geometry.mtp_layer_types)."""
    width = len(geometry.mtp_layer_types)
    if not 0 <= inner < width:
        raise ValueError(f"MTP inner layer {inner} outside the {width}-layer MTP pattern {geometry.mtp_layer_types}")
    return block * width + inner


def hf_layer(match: re.Match[str], geometry: Geometry, suffix: str) -> str:
    """HF name of `suffix` in the matched Megatron layer: backbone.layers.N.<suffix>, or mtp.layers.{d * P + i}.<suffix>
    for inner layer i of MTP block d."""
    if match["layer"] is not None:
        return f"backbone.layers.{match['layer']}.{suffix}"
    return f"mtp.layers.{mtp_index(int(match['mtp']), int(match['inner']), geometry)}.{suffix}"


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
    lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, geometry, "norm.weight")),
)
"""Every layer's single norm is HF `backbone.layers.N.norm.weight`, whichever Megatron module holds it (local spec:
`norm` / `input_layernorm` / `pre_mlp_layernorm`; TE spec: the fused linear's `layer_norm_weight`)."""
MAMBA_MIXER = (
    MappingRule(
        LAYER_PREFIX + r"mixer\.in_proj\.weight",
        lambda match, geometry: mamba_in_proj(
            megatron=match[0], hf=hf_layer(match, geometry, "mixer.in_proj.weight"), **mamba_sizes(geometry)
        ),
    ),
    MappingRule(
        LAYER_PREFIX + r"mixer\.conv1d[._](?P<kind>weight|bias)",
        lambda match, geometry: mamba_conv1d(
            megatron=match[0], hf=hf_layer(match, geometry, f"mixer.conv1d.{match['kind']}"), **mamba_sizes(geometry)
        ),
    ),
    MappingRule(
        LAYER_PREFIX + r"mixer\.(?P<param>A_log|D|dt_bias|norm\.weight)",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, geometry, f"mixer.{match['param']}")),
    ),
    MappingRule(
        LAYER_PREFIX + r"mixer\.out_proj\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, geometry, "mixer.out_proj.weight"), dim=1),
    ),
)
ATTENTION = (
    MappingRule(
        LAYER_PREFIX + r"self_attention\.linear_qkv\.weight",
        lambda match, geometry: FusedQKV(
            megatron=match[0],
            q=hf_layer(match, geometry, "mixer.q_proj.weight"),
            k=hf_layer(match, geometry, "mixer.k_proj.weight"),
            v=hf_layer(match, geometry, "mixer.v_proj.weight"),
            num_heads=geometry.num_heads,
            num_query_groups=geometry.num_query_groups,
            head_dim=geometry.head_dim,
        ),
    ),
    MappingRule(
        LAYER_PREFIX + r"self_attention\.linear_proj\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, geometry, "mixer.o_proj.weight"), dim=1),
    ),
)
MLP = (  # not gated: down(relu2(up(x)))
    MappingRule(
        LAYER_PREFIX + r"mlp\.linear_fc1\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, geometry, "mixer.up_proj.weight")),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.linear_fc2\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, geometry, "mixer.down_proj.weight"), dim=1),
    ),
)
MOE = (
    MappingRule(
        LAYER_PREFIX + r"mlp\.router\.weight",
        lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, geometry, "mixer.gate.weight")),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.router\.expert_bias",
        lambda match, geometry: Replicated(
            megatron=match[0], hf=hf_layer(match, geometry, "mixer.gate.e_score_correction_bias")
        ),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.shared_experts\.linear_fc1\.weight",
        lambda match, geometry: Split(
            megatron=match[0], hf=hf_layer(match, geometry, "mixer.shared_experts.up_proj.weight")
        ),
    ),
    MappingRule(
        LAYER_PREFIX + r"mlp\.shared_experts\.linear_fc2\.weight",
        lambda match, geometry: Split(
            megatron=match[0], hf=hf_layer(match, geometry, "mixer.shared_experts.down_proj.weight"), dim=1
        ),
    ),
    MappingRule(  # latent MoE (Nemotron-3 Super): TELinear duplicated on every rank, fc1 [latent, H], fc2 [H, latent]
        LAYER_PREFIX + r"mlp\.(?P<proj>fc1_latent_proj|fc2_latent_proj)\.weight",
        lambda match, geometry: Replicated(
            megatron=match[0], hf=hf_layer(match, geometry, f"mixer.{match['proj']}.weight")
        ),
    ),
    MappingRule(
        LAYER_PREFIX + expert_weight(1),
        lambda match, geometry: Split(
            megatron=match[0],
            axis="etp",
            expert=int(expert_id(match)),
            num_experts=geometry.num_experts,
            hf=hf_layer(match, geometry, f"mixer.experts.{expert_id(match)}.up_proj.weight"),
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
            hf=hf_layer(match, geometry, f"mixer.experts.{expert_id(match)}.down_proj.weight"),
        ),
    ),
)


def _mtp_own(name: str, inner: str) -> MappingRule:
    """An MTP block's norm `name` (enorm / hnorm / final_layernorm), every rank holding it whole, on the HF inner layer
    `inner` ("first" or "last") of the block."""

    def build(match: re.Match[str], geometry: Geometry) -> Replicated:
        at = 0 if inner == "first" else len(geometry.mtp_layer_types) - 1
        index = mtp_index(int(match["mtp"]), at, geometry)
        return Replicated(megatron=match[0], hf=f"mtp.layers.{index}.{name}")

    return MappingRule(MTP_BLOCK + re.escape(name), build)


MTP = (
    _mtp_own("enorm.weight", "first"),
    _mtp_own("hnorm.weight", "first"),
    _mtp_own("final_layernorm.weight", "last"),
    MappingRule(  # column parallel: [hidden/tp, 2 * hidden], input [enorm(embedding); hnorm(hidden)]
        MTP_BLOCK + r"eh_proj\.weight",
        lambda match, geometry: Split(
            megatron=match[0], hf=f"mtp.layers.{mtp_index(int(match['mtp']), 0, geometry)}.eh_proj.weight"
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
        *MTP,
    ]
