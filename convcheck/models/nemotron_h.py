"""NemotronH (HybridModel): Mamba `M`, attention `*`, squared-ReLU MLP `-` and MoE `E` layers, each one pre-norm.

Explicit mappings, the config table (hybrid pattern, Mamba-2 mixers, sigmoid router) and the tiny fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.bridge_wide import QUANT_MAPPING_NOT_IMPLEMENTED
from convcheck.models.config_rules import (
    HEADS_AND_VOCAB,
    FieldRule,
    HfView,
    MegatronGet,
    function_name,
    implied,
    same,
    unsupported,
)
from convcheck.models.fixture_spec import TINY_SHAPES, FixtureSpec, engine_variant
from convcheck.models.registered_bugs import TRANSFORMERS_EMBEDDING_SAVED_SINGULAR
from convcheck.models.upstream_bug import UpstreamBug

EMBEDDING = "backbone.embeddings.weight"

# ---- config table --------------------------------------------------------------------------------------------------

MIXERS = "model.decoder.layers.*.mixer"
"""Every local Mamba mixer of a HybridModel (attention / MLP / MoE layers have no `mixer`)."""
PATTERN_CHARS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
"""HF layers_block_type -> Megatron's hybrid pattern letter."""


def _pattern(c: HfView, _m: MegatronGet) -> str:
    """HF layers_block_type as Megatron's hybrid layer pattern (M mamba, * attention, - MLP, E MoE)."""
    types = c["layers_block_type"]
    return "".join(PATTERN_CHARS.get(t, unsupported(f"layer type {t!r}")) for t in types)


def _megatron_pattern(value: Any, _m: MegatronGet) -> Any:
    """Main-decoder part of a Megatron hybrid pattern: pipeline stage marks `|` dropped, MTP part after `/` cut."""
    return value.split("/")[0].replace("|", "") if isinstance(value, str) else value


def per_mixer(attr: str, hf: tuple[str, ...], value: Callable[[HfView], Any], note: str = "") -> FieldRule:
    """Every local Mamba mixer's `attr` (a MambaMixer attribute) holds value(hf config)."""
    return FieldRule(
        megatron=f"{MIXERS}.{attr}",
        hf=hf,
        expect=lambda c, m: [value(c)] * len(m(MIXERS)),
        note=note,
    )


def _conv_bias(mixer: Any) -> Any:
    """A Mamba mixer's conv bias: `conv1d_bias` (megatron-core 0.19) or its nn.Conv1d's `bias` (0.16-0.18)."""
    if hasattr(mixer, "conv1d_bias"):
        return mixer.conv1d_bias
    return getattr(getattr(mixer, "conv1d", None), "bias", None)


def _mtp_pattern(c: HfView, _m: MegatronGet) -> Any:
    if not c.get("num_nextn_predict_layers"):
        return None
    return "".join(PATTERN_CHARS[t] for t in c["mtp_layers_block_type"])


def _router_topk(c: HfView, _m: MegatronGet) -> Any:
    topk = c["num_experts_per_tok"]
    if topk > 1 and not c["norm_topk_prob"]:
        return unsupported("unnormalised sigmoid top-k weights (norm_topk_prob false)")
    return topk


def _linear_bias(c: HfView, _m: MegatronGet) -> Any:
    if c["mlp_bias"] or c["use_bias"]:
        return unsupported("MLP / Mamba projection biases (HF o_proj never has one, Megatron's linear_proj would)")
    return False


NEMOTRON_H_TABLE = (
    FieldRule(megatron="num_layers", hf=("layers_block_type",), expect=lambda c, _m: len(c["layers_block_type"])),
    FieldRule(
        megatron="hybrid_layer_pattern",
        hf=("layers_block_type",),
        expect=_pattern,
        observe=_megatron_pattern,
        note="which mixer each layer runs",
    ),
    same("hidden_size", "hidden_size"),
    same("intermediate_size", "ffn_hidden_size", note="dense MLP layers (-)"),
    *HEADS_AND_VOCAB,
    same("max_position_embeddings", "seq_length", note="no position embedding: a length limit only"),
    same("layer_norm_epsilon", "layernorm_epsilon", note="block norms and the final norm"),
    per_mixer(
        "norm.eps",
        ("layer_norm_epsilon",),
        lambda c: c["layer_norm_epsilon"],
        note="HF's gated Mamba norm takes layer_norm_epsilon; megatron-core 0.19.2 mamba_mixer.py builds it with 1e-5",
    ),
    implied("normalization", "RMSNorm", "RMSNorm everywhere (block norms, gated Mamba norm, final norm)"),
    implied("layernorm_zero_centered_gamma", False, "HF RMSNorm multiplies by weight, not 1 + weight"),
    implied("position_embedding_type", "none", "NemotronH attention applies no rotary or absolute positions"),
    implied("softmax_scale", None, "attention scale 1/sqrt(head_dim) as in HF"),
    implied("qk_layernorm", False, "NemotronH attention has no q/k norm"),
    FieldRule(
        megatron="add_qkv_bias",
        hf=("attention_bias",),
        expect=lambda _c, _m: False,
        note="HF NemotronHAttention builds q/k/v/o without bias whatever attention_bias says",
    ),
    FieldRule(megatron="add_bias_linear", hf=("mlp_bias", "use_bias"), expect=_linear_bias),
    FieldRule(
        megatron="activation_func",
        hf=("mlp_hidden_act",),
        expect=lambda c, _m: {"relu2": "squared_relu"}.get(c["mlp_hidden_act"], unsupported(c["mlp_hidden_act"])),
        observe=function_name,
        note="MLP and experts: down(act(up(x)))",
    ),
    implied("gated_linear_unit", False, "NemotronH MLP and experts are not gated"),
    same("tie_word_embeddings", "share_embeddings_and_output_weights"),
    FieldRule(
        megatron="window_size",
        hf=("sliding_window",),
        expect=lambda c, _m: None if c.get("sliding_window") is None else unsupported("sliding-window attention"),
    ),
    same("attention_dropout", "attention_dropout", absent=0.0),
    same("hidden_dropout", "hidden_dropout", absent=0.0),
    same("residual_in_fp32", "fp32_residual_connection"),
    # Mamba-2 mixers
    same("mamba_num_heads", "mamba_num_heads"),
    same("mamba_head_dim", "mamba_head_dim"),
    same("n_groups", "mamba_num_groups"),
    same("ssm_state_size", "mamba_state_dim"),
    per_mixer(
        "chunk_size",
        ("chunk_size",),
        lambda c: c["chunk_size"],
        note="scan block length, as each built mixer holds it (megatron-core <= 0.18 configs have no "
        "mamba_chunk_size); the computed function does not depend on it",
    ),
    per_mixer(
        "d_inner",
        ("mamba_num_heads", "mamba_head_dim", "expand"),
        lambda c: c["mamba_num_heads"] * c["mamba_head_dim"],
        note="HF ignores expand, and so does Megatron once mamba_num_heads is set",
    ),
    per_mixer("d_conv", ("conv_kernel",), lambda c: c["conv_kernel"]),
    per_mixer(
        "activation",
        ("mamba_hidden_act",),
        lambda c: c["mamba_hidden_act"] if c["mamba_hidden_act"] in ("silu", "swish") else unsupported("act"),
        note="conv activation; megatron-core 0.19.2 always uses silu",
    ),
    FieldRule(
        megatron=MIXERS,
        hf=("use_conv_bias",),
        expect=lambda c, m: [c["use_conv_bias"]] * len(m(MIXERS)),
        observe=lambda mixers, _m: [_conv_bias(mixer) is not None for mixer in mixers],
        note="True when the mixer has a conv bias",
    ),
    FieldRule(
        megatron=MIXERS,
        hf=("time_step_limit",),
        expect=lambda c, m: (
            ["(0, inf)" if tuple(c["time_step_limit"]) == (0.0, float("inf")) else unsupported("a dt clamp")]
            * len(m(MIXERS))
        ),
        observe=lambda value, _m: ["(0, inf)"] * len(value),
        note="megatron-core 0.19.2 calls the scan without dt_limit: the kernels' default (0, inf), no clamp",
    ),
    per_mixer(
        "norm.group_size",
        ("n_groups", "mamba_num_heads", "mamba_head_dim"),
        lambda c: c["mamba_num_heads"] * c["mamba_head_dim"] // c["n_groups"],
        note="the gated RMSNorm normalises each group's channels separately",
    ),
    per_mixer("norm_before_gate", (), lambda _c: False, note="HF gates with silu(z) before the group RMSNorm"),
    per_mixer("rmsnorm", (), lambda _c: True, note="HF always applies the gated RMSNorm"),
    per_mixer("D_has_hdim", (), lambda _c: False, note="HF D is one value per head"),
    # MoE layers (E)
    same("n_routed_experts", "num_moe_experts"),
    FieldRule(
        megatron="moe_router_topk",
        hf=("num_experts_per_tok", "norm_topk_prob"),
        expect=_router_topk,
        note="Megatron's sigmoid router always renormalises the top-k weights when top-k > 1",
    ),
    same("moe_intermediate_size", "moe_ffn_hidden_size"),
    FieldRule(
        megatron="moe_shared_expert_intermediate_size",
        hf=("moe_shared_expert_intermediate_size", "n_shared_experts"),
        expect=lambda c, _m: c["moe_shared_expert_intermediate_size"],
        note="HF builds one shared MLP of moe_shared_expert_intermediate_size; n_shared_experts is not read",
    ),
    same("moe_latent_size", "moe_latent_size"),
    FieldRule(
        megatron="moe_router_topk_scaling_factor",
        hf=("routed_scaling_factor",),
        expect=lambda c, _m: float(c["routed_scaling_factor"]),
        observe=lambda value, _m: 1.0 if value is None else float(value),
    ),
    FieldRule(
        megatron="moe_router_num_groups",
        hf=("n_group", "topk_group"),
        expect=lambda c, _m: 1 if c["n_group"] == 1 else unsupported("group-limited routing (n_group > 1)"),
        observe=lambda value, _m: value or 1,
    ),
    implied("moe_router_score_function", "sigmoid", "HF router: sigmoid of the expert logits"),
    implied("moe_router_enable_expert_bias", True, "HF selects experts on sigmoid + e_score_correction_bias"),
    implied("moe_router_dtype", "fp32", "HF router logits are computed in float32"),
    FieldRule(
        megatron="mtp_num_layers",
        hf=("num_nextn_predict_layers",),
        expect=lambda c, _m: c.get("num_nextn_predict_layers") or 0,
        observe=lambda value, _m: value or 0,
    ),
    FieldRule(
        megatron="mtp_hybrid_override_pattern",
        hf=("mtp_layers_block_type", "num_nextn_predict_layers"),
        expect=_mtp_pattern,
        note="MTP layer types, read only when num_nextn_predict_layers > 0",
    ),
)

# ---- fixture and architecture --------------------------------------------------------------------------------------

# Mamba: 4 heads x 8, 2 groups, state 8, so in_proj is [2*32 + 2*2*8 + 4, 32] = [100, 32]; chunk size 128 (another
# size deep-copies the layer spec upstream). transformers 5.12.1 saves the embedding as `backbone.embedding.weight`;
# published NemotronH checkpoints (and the bridge) use `backbone.embeddings.weight`, so the fixture is written with the
# published name.
TINY_NEMOTRON_H = FixtureSpec(
    name="nemotron-h",
    config_class="NemotronHConfig",
    description="NemotronH hybrid M*-ME: Mamba, attention, MLP, MoE (4 experts top-2, shared expert)",
    config={
        **{k: v for k, v in TINY_SHAPES.items() if k not in ("num_hidden_layers", "rms_norm_eps")},
        "hybrid_override_pattern": "M*-ME",
        "layer_norm_epsilon": 1e-5,
        "mamba_num_heads": 4,
        "mamba_head_dim": 8,
        "n_groups": 2,
        "ssm_state_size": 8,
        "conv_kernel": 4,
        "expand": 1,
        "chunk_size": 128,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "moe_shared_expert_intermediate_size": 16,
        "n_shared_experts": 1,
    },
    fp32_tensors=("gate.e_score_correction_bias",),
    renames={"backbone.embedding.weight": EMBEDDING},
)


def _pattern_variant(name: str, pattern: str, description: str) -> FixtureSpec:
    """tiny:nemotron-h with another hybrid pattern (same widths, fp32 tensors and renames)."""
    return FixtureSpec(
        name=name,
        config_class="NemotronHConfig",
        description=description,
        config={**TINY_NEMOTRON_H.config, "hybrid_override_pattern": pattern},
        fp32_tensors=TINY_NEMOTRON_H.fp32_tensors,
        renames=TINY_NEMOTRON_H.renames,
    )


# Six layers, so PP2 splits the pattern: stage 0 holds M*- (Mamba, attention, MLP), stage 1 M*E (Mamba, attention, MoE).
TINY_NEMOTRON_H_6L = _pattern_variant(
    "nemotron-h-6l", "M*-M*E", "NemotronH hybrid M*-M*E: every layer type, the pattern split in two by PP2"
)
# The same without the dense MLP layer: transformers 5.3 (bridge 0.4.x) knows only mamba, attention and moe layers.
TINY_NEMOTRON_H_MOE = _pattern_variant(
    "nemotron-h-moe",
    "M*ME",
    "NemotronH hybrid M*ME: Mamba, attention, MoE, no dense MLP (the layer types transformers 5.3 has)",
)

TINY_NEMOTRON_H_VLLM = engine_variant(
    _pattern_variant("nemotron-h", "M*-", ""),
    "NemotronH hybrid M*- (Mamba, attention, MLP) with hidden 64, head_dim 32 and Mamba heads 32 wide, which CPU "
    "vLLM's kernels accept (its MoE needs a gated activation: see nemotron-h-moe-vllm)",
    hidden_size=64,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=32,
    mamba_head_dim=32,
    ssm_state_size=16,
)
TINY_NEMOTRON_H_MOE_VLLM = engine_variant(
    _pattern_variant("nemotron-h-moe", "M*-E", ""),
    "NemotronH hybrid M*-E with the -vllm widths and expert width 32: CPU vLLM cannot run its non-gated (relu2) MoE",
    **{**TINY_NEMOTRON_H_VLLM.config, "hybrid_override_pattern": "M*-E", "moe_intermediate_size": 32,
       "moe_shared_expert_intermediate_size": 32},
)  # fmt: skip

# Nemotron-3 Super's structure (nvidia/NVIDIA-Nemotron-3-Super-120B-A12B config.json, tests/data): Mamba / MoE pairs
# with attention every few layers, no dense MLP layer, 512 experts top-22 in one group with a shared expert twice the
# expert width, routed_scaling_factor 5, and one MTP block of pattern `*E` (an attention and an MoE layer) written
# as published, `mtp.layers.{0,1}.*`. Shrunk: 88 layers -> ME*EME (PP2: ME* | EME), 512 experts -> 8 top-2 (EP2),
# widths as tiny:nemotron-h. Super's latent MoE (moe_latent_size 1024) is left out: megatron-core 0.19.2 builds the
# latent projections only with Transformer Engine (transformer/moe/moe_layer.py:266), which a CPU host lacks.
NEMOTRON_3_MTP_PATTERN = "ME*EME"
TINY_NEMOTRON_3_MTP = FixtureSpec(
    name="nemotron-3-mtp",
    config_class="NemotronHConfig",
    description="Nemotron-3 Super shape ME*EME: Mamba, MoE (8 experts top-2, shared expert, scaling 5), attention, and "
    "one MTP block *E (attention + MoE) as published; no latent MoE (TE-only in megatron-core)",
    config={
        **TINY_NEMOTRON_H.config,
        "hybrid_override_pattern": NEMOTRON_3_MTP_PATTERN,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 20,
        "moe_shared_expert_intermediate_size": 40,
        "routed_scaling_factor": 5.0,
        "moe_shared_expert_overlap": False,
        "num_nextn_predict_layers": 1,
        "mtp_layers_block_type": ["attention", "moe"],
    },
    fp32_tensors=TINY_NEMOTRON_H.fp32_tensors,
    renames=TINY_NEMOTRON_H.renames,
    mtp_layers=1,
    mtp_style="nemotron",
)

MTP_NORM_UNMAPPED = UpstreamBug(
    name="nemotronh-mtp-norm-unmapped",
    summary="the MTP layers' mappings name their pre-norms only as TE's fused layer_norm_weight and pre_mlp_layernorm, "
    "not as the separate input_layernorm / norm the decoder's mappings add for the local and quantization (modelopt) "
    "specs; an MTP attention layer built so has an unmapped input_layernorm.weight whose empty conversion task crashes "
    "load_hf_weights and export_hf_weights (seen with `--spec local`; the TE spec passes)",
    where="megatron/bridge/models/nemotronh/nemotron_h_bridge.py:456-476 (mtp_nested; the decoder's separate norms at "
    ":393-397); the crash at conversion/model_bridge.py:1100 (load) and :1340 (export) in 0.6.2",
    findings=(
        ("coverage", "mtp.layers.*.mtp_model_layer.layers.*.input_layernorm.weight", "unmapped"),
        ("coverage", "mtp.layers.*.norm.weight", "not-exported"),
        ("elements", "mtp.layers.*.norm.weight", "never-written"),
    ),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
    ),
    seen_in=("0.6.2",),
)
"""Every other finding of such a run follows from the two crashes (what the import and export never reach)."""

MTP_PATTERN_EXPORT_RAISES = UpstreamBug(
    name="nemotronh-mtp-pattern-export-raises",
    summary="megatron_to_hf_config hands back the Megatron hybrid_layer_pattern whole, MTP block after its '/' "
    "separator included, as hybrid_override_pattern: 0.4.x passes it through and transformers' NemotronHConfig raises "
    "KeyError on the '/' character; 0.5.x rejects it itself (ValueError, unknown layer type '/'); a model with MTP "
    "has no HF config export (0.6.x splits the pattern on '/')",
    where="megatron/bridge/models/nemotronh/nemotron_h_bridge.py:241 (0.4.2, the pattern mapped through; transformers "
    "5.3.0 configuration_nemotron_h.py:260 raises) and :325-337 (0.5.1); fixed at :328 in 0.6.2",
    findings=(("config", "<megatron_to_hf_config>", "roundtrip-failed"),),
    message_contains="'/'",
    seen_in=("0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1"),
    fixed_in="0.6.0",
)

MTP_PATTERN_WITHOUT_MTP_LAYERS = UpstreamBug(
    name="nemotronh-mtp-pattern-without-mtp-layers",
    summary="the NemotronH bridge copies mtp_hybrid_override_pattern into the provider whenever the config has the "
    "field, with num_nextn_predict_layers 0 too (transformers' NemotronHConfig default: '*E' and 0 MTP layers): the "
    "Megatron config carries an MTP block the checkpoint has none of, and its config export then fails on it "
    "(nemotronh-mtp-pattern-export-raises)",
    where="megatron/bridge/models/nemotronh/nemotron_h_bridge.py:307 (0.4.x), :309 (0.5.x); 0.6.x reads the pattern "
    "only for num_nextn_predict_layers > 0 (_hf_mtp_config, nemotron_h_bridge.py:252-263)",
    findings=(("config", "mtp_layers_block_type+num_nextn_predict_layers -> mtp_hybrid_override_pattern", "mismatch"),),
    seen_in=("0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1"),
    fixed_in="0.6.0",
)
"""Seen by `convcheck support` on bridge 0.5.1 (NemotronHForCausalLM from transformers 5.8.1's default config, TP2 and
EP2); the source line is the same in 0.4.0-0.5.0."""

NEMOTRON_H = Architecture(
    hf_classes=("NemotronHForCausalLM",),
    model_type="nemotron_h",
    mapping_rules="convcheck.models.nemotron_h_mappings:hybrid_rules",
    config_rules=NEMOTRON_H_TABLE,
    fixtures=(
        TINY_NEMOTRON_H,
        TINY_NEMOTRON_H_MOE,
        TINY_NEMOTRON_H_6L,
        TINY_NEMOTRON_H_VLLM,
        TINY_NEMOTRON_H_MOE_VLLM,
        TINY_NEMOTRON_3_MTP,
    ),
    upstream_bugs=(
        QUANT_MAPPING_NOT_IMPLEMENTED,
        TRANSFORMERS_EMBEDDING_SAVED_SINGULAR,
        MTP_NORM_UNMAPPED,
        MTP_PATTERN_EXPORT_RAISES,
        MTP_PATTERN_WITHOUT_MTP_LAYERS,
    ),
)
