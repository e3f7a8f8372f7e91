"""DeepSeek-V3-style models' explicit mappings: every Megatron parameter of the decoder (multi-latent attention,
dense-first MLP, router with its fp32 expert bias, shared and routed experts) and of the MTP layers.

MTP layer k (megatron-core's `mtp.layers.k`) is HF's `model.layers.{L + k}` with L = num_hidden_layers: its
transformer layer `mtp.layers.k.mtp_model_layer.*` carries the decoder layer's names, and its own enorm, hnorm,
eh_proj and final_layernorm are HF's enorm, hnorm, eh_proj and shared_head.norm. Its embed_tokens and
shared_head.head repeat model.embed_tokens and lm_head in published checkpoints; Megatron holds no parameter for
them (the MTP block uses the model's own embedding and output layer), so the embedding's and the output layer's
mappings produce them as copies (convcheck.mappings.copies).
"""

from __future__ import annotations

import re

from convcheck.hf.geometry import Geometry
from convcheck.mappings import Gated, Replicated, Split, TensorMapping
from convcheck.mappings.copies import with_copies
from convcheck.mappings.mla import kv_down, kv_up, q_down, q_up
from convcheck.mappings.registry import MappingRule
from convcheck.models.dense_mappings import EMBEDDING, output_layer
from convcheck.models.shared_mappings import routed_expert_rules, vocab_rows

TRANSFORMER_LAYER = r"(decoder\.layers\.(?P<layer>\d+)|mtp\.layers\.(?P<mtp>\d+)\.mtp_model_layer)\."
"""A decoder layer (`layer`: its global number) or MTP layer k's transformer layer (`mtp`: k)."""
MTP_LAYER = r"mtp\.layers\.(?P<mtp>\d+)\."
LM_HEAD = "lm_head.weight"


def hf_layer(match: re.Match[str], geometry: Geometry, suffix: str) -> str:
    """HF name of `suffix` in the matched layer: model.layers.N.<suffix>, N = L + k for MTP layer k."""
    layer = match.groupdict().get("layer")
    index = int(layer) if layer is not None else geometry.num_layers + int(match["mtp"])
    return f"model.layers.{index}.{suffix}"


def _replicated(pattern: str, suffix: str) -> MappingRule:
    """A norm or router tensor every rank holds whole."""
    return MappingRule(
        pattern, lambda match, geometry: Replicated(megatron=match[0], hf=hf_layer(match, geometry, suffix))
    )


NORMS = (
    _replicated(TRANSFORMER_LAYER + r"input_layernorm\.weight", "input_layernorm.weight"),
    # local spec: pre_mlp_layernorm in dense and MoE layers; TE spec: a dense layer's fused linear_fc1 norm
    _replicated(
        TRANSFORMER_LAYER + r"(pre_mlp_layernorm\.weight|mlp\.linear_fc1\.layer_norm_weight)",
        "post_attention_layernorm.weight",
    ),
    # local spec: MLA's own q / kv norms; TE spec: fused into the up projections
    _replicated(
        TRANSFORMER_LAYER + r"self_attention\.(q_layernorm\.weight|linear_q_up_proj\.layer_norm_weight)",
        "self_attn.q_a_layernorm.weight",
    ),
    _replicated(
        TRANSFORMER_LAYER + r"self_attention\.(kv_layernorm\.weight|linear_kv_up_proj\.layer_norm_weight)",
        "self_attn.kv_a_layernorm.weight",
    ),
)
MLA = (
    MappingRule(  # local spec: column-parallel; TE spec: TELinear duplicated on every TP rank
        TRANSFORMER_LAYER + r"self_attention\.linear_q_down_proj\.weight",
        lambda match, geometry: (
            Replicated(megatron=match[0], hf=hf_layer(match, geometry, "self_attn.q_a_proj.weight"))
            if geometry.te_spec
            else q_down(
                megatron=match[0],
                hf=hf_layer(match, geometry, "self_attn.q_a_proj.weight"),
                q_lora_rank=geometry.q_lora_rank,
                hidden=geometry.hidden,
            )
        ),
    ),
    MappingRule(
        TRANSFORMER_LAYER + r"self_attention\.linear_q_up_proj\.weight",
        lambda match, geometry: q_up(
            megatron=match[0],
            hf=hf_layer(match, geometry, "self_attn.q_b_proj.weight"),
            heads=geometry.num_heads,
            nope_dim=geometry.qk_nope_head_dim,
            rope_dim=geometry.qk_rope_head_dim,
            cols=geometry.q_lora_rank,
        ),
    ),
    MappingRule(  # q_lora_rank None (DeepSeek-V2-Lite, Moonlight): one q projection of the normed hidden states
        TRANSFORMER_LAYER + r"self_attention\.linear_q_proj\.weight",
        lambda match, geometry: q_up(
            megatron=match[0],
            hf=hf_layer(match, geometry, "self_attn.q_proj.weight"),
            heads=geometry.num_heads,
            nope_dim=geometry.qk_nope_head_dim,
            rope_dim=geometry.qk_rope_head_dim,
            cols=geometry.hidden,
        ),
    ),
    MappingRule(
        TRANSFORMER_LAYER + r"self_attention\.linear_kv_down_proj\.weight",
        lambda match, geometry: (
            Replicated(megatron=match[0], hf=hf_layer(match, geometry, "self_attn.kv_a_proj_with_mqa.weight"))
            if geometry.te_spec
            else kv_down(
                megatron=match[0],
                hf=hf_layer(match, geometry, "self_attn.kv_a_proj_with_mqa.weight"),
                kv_lora_rank=geometry.kv_lora_rank,
                rope_dim=geometry.qk_rope_head_dim,
                hidden=geometry.hidden,
            )
        ),
    ),
    MappingRule(
        TRANSFORMER_LAYER + r"self_attention\.linear_kv_up_proj\.weight",
        lambda match, geometry: kv_up(
            megatron=match[0],
            hf=hf_layer(match, geometry, "self_attn.kv_b_proj.weight"),
            heads=geometry.num_heads,
            nope_dim=geometry.qk_nope_head_dim,
            v_dim=geometry.v_head_dim,
            kv_lora_rank=geometry.kv_lora_rank,
        ),
    ),
    MappingRule(  # row parallel: [hidden, heads/tp * v_head_dim]
        TRANSFORMER_LAYER + r"self_attention\.linear_proj\.weight",
        lambda match, geometry: Split(
            megatron=match[0], hf=hf_layer(match, geometry, "self_attn.o_proj.weight"), dim=1
        ),
    ),
)


def _gated(pattern: str, mlp: str) -> MappingRule:
    """fc1 `[2F/tp, hidden]` = `[gate_r; up_r]` of a dense MLP or the shared experts (`mlp`: their HF prefix)."""
    return MappingRule(
        pattern,
        lambda match, geometry: Gated(
            megatron=match[0],
            gate=hf_layer(match, geometry, f"{mlp}.gate_proj.weight"),
            up=hf_layer(match, geometry, f"{mlp}.up_proj.weight"),
        ),
    )


def _down(pattern: str, mlp: str) -> MappingRule:
    """fc2 `[hidden, F/tp]` (row parallel) of a dense MLP or the shared experts."""
    return MappingRule(
        pattern,
        lambda match, geometry: Split(
            megatron=match[0], hf=hf_layer(match, geometry, f"{mlp}.down_proj.weight"), dim=1
        ),
    )


def _expert(match: re.Match[str], geometry: Geometry, projection: str) -> str:
    """HF name of one routed expert's projection weight, with an `{expert}` field left to fill."""
    return hf_layer(match, geometry, f"mlp.experts.{{expert}}.{projection}.weight")


MLP = (  # the dense-first layers' MLP, and the shared experts (tensor parallel like a dense MLP)
    _gated(TRANSFORMER_LAYER + r"mlp\.linear_fc1\.weight", "mlp"),
    _down(TRANSFORMER_LAYER + r"mlp\.linear_fc2\.weight", "mlp"),
    _gated(TRANSFORMER_LAYER + r"mlp\.shared_experts\.linear_fc1\.weight", "mlp.shared_experts"),
    _down(TRANSFORMER_LAYER + r"mlp\.shared_experts\.linear_fc2\.weight", "mlp.shared_experts"),
)
ROUTED = (
    _replicated(TRANSFORMER_LAYER + r"mlp\.router\.weight", "mlp.gate.weight"),
    # a float32 buffer in Megatron and in published checkpoints: Replicated keeps the dtype, the compare checks it
    _replicated(TRANSFORMER_LAYER + r"mlp\.router\.expert_bias", "mlp.gate.e_score_correction_bias"),
    *routed_expert_rules(TRANSFORMER_LAYER, _expert),
)


MTP = (
    _replicated(MTP_LAYER + r"enorm\.weight", "enorm.weight"),
    _replicated(MTP_LAYER + r"hnorm\.weight", "hnorm.weight"),
    _replicated(MTP_LAYER + r"final_layernorm\.weight", "shared_head.norm.weight"),
    MappingRule(  # column parallel: [hidden/tp, 2 * hidden], input [enorm(embedding); hnorm(hidden)]
        MTP_LAYER + r"eh_proj\.weight",
        lambda match, geometry: Split(megatron=match[0], hf=hf_layer(match, geometry, "eh_proj.weight")),
    ),
)


def mtp_copies(geometry: Geometry, suffix: str, source: str) -> tuple[tuple[str, str], ...]:
    """(model.layers.{L + k}.<suffix>, source) for every MTP layer k: the checkpoint's copies of `source`."""
    first = geometry.num_layers
    return tuple((f"model.layers.{first + k}.{suffix}", source) for k in range(geometry.mtp_layers))


def vocabulary(tied: bool) -> list[MappingRule]:
    """Embedding, final norm and output layer; the MTP layers' embed_tokens / shared_head.head are copies of the
    embedding and of lm_head (of the embedding too when tied: the output layer then produces nothing itself)."""

    def embedding(match: re.Match[str], geometry: Geometry) -> TensorMapping:
        copies = mtp_copies(geometry, "embed_tokens.weight", EMBEDDING)
        if tied:
            copies += mtp_copies(geometry, "shared_head.head.weight", EMBEDDING)
        return with_copies(vocab_rows(match[0], EMBEDDING, geometry), copies)

    def head(match: re.Match[str], geometry: Geometry) -> TensorMapping:
        copies = mtp_copies(geometry, "shared_head.head.weight", LM_HEAD)
        return with_copies(vocab_rows(match[0], LM_HEAD, geometry), copies)

    return [
        MappingRule(r"embedding\.word_embeddings\.weight", embedding),
        MappingRule(
            r"decoder\.final_layernorm\.weight",
            lambda match, geometry: Replicated(megatron=match[0], hf="model.norm.weight"),
        ),
        output_layer(tied) if tied else MappingRule(r"output_layer\.weight", head),
    ]


def deepseek_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of a DeepSeek-V3-style model (tied: the output layer copies the embedding)."""
    return [*vocabulary(tied), *NORMS, *MLA, *MLP, *ROUTED, *MTP]
