"""Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text): config table, tiny fixture and the bridge bugs convcheck
names. The bridge builds it only on Transformer Engine (convcheck.models.te_only); its mappings are gemma3_mappings.

The table is megatron-bridge 0.6.2's gemma/gemma3_bridge.py provider_bridge and gemma3_provider.py (cited as
provider) against transformers 5.12.1's models/gemma3/modeling_gemma3.py (cited as HF)."""

from __future__ import annotations

import math
from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.config_rules import (
    HEADS_AND_VOCAB,
    FieldRule,
    HfView,
    MegatronGet,
    built_qk_norms,
    function_name,
    implied,
    same,
    unsupported,
)
from convcheck.models.fixture_spec import TINY_SHAPES, FixtureSpec
from convcheck.models.gpt_oss_config import hf_window_layers
from convcheck.models.te_spec_bugs import POST_LAYERNORM_DEFAULT_EPS
from convcheck.models.upstream_bug import UpstreamBug

SLIDING, FULL = "rope_parameters.sliding_attention", "rope_parameters.full_attention"
"""transformers 5 keeps one RoPE setting per layer type (Gemma3TextConfig.rope_parameters)."""


def _rope(c: HfView, kind: str) -> dict[str, Any]:
    value = c.get(kind)
    return value if isinstance(value, dict) else {}


def _transformers4(c: HfView) -> bool:
    """Whether the config spells RoPE as transformers 4 does: top-level rope_theta (the full layers'),
    rope_local_base_freq (the sliding layers') and rope_scaling (the full layers' scaling), no rope_parameters."""
    return not _rope(c, SLIDING) and not _rope(c, FULL) and "rope_theta" in c


def _bases(c: HfView, _m: MegatronGet) -> list[float]:
    """[local base, global base]: the sliding layers' rope_theta, then the full layers' (provider rotary_base)."""
    if _transformers4(c):
        return [float(c.get("rope_local_base_freq", math.nan)), float(c["rope_theta"])]
    return [float(_rope(c, SLIDING).get("rope_theta", math.nan)), float(_rope(c, FULL).get("rope_theta", math.nan))]


def _global_factor(c: HfView, _m: MegatronGet) -> Any:
    """The global RoPE's linear factor (the 4B-27B checkpoints' 8.0; 1.0 where the full layers rotate plainly): the
    provider divides the global inv_freq by it (Gemma3RotaryEmbedding), as HF's linear type divides positions."""
    if _transformers4(c):  # rope_scaling scales the full layers only; the sliding layers rotate plainly
        local, scaling = "default", c.get("rope_scaling") or {}
        full = scaling.get("rope_type", scaling.get("type", "default"))
    else:
        local, full = _rope(c, SLIDING).get("rope_type", "default"), _rope(c, FULL).get("rope_type", "default")
        scaling = _rope(c, FULL)
    if local != "default":
        return unsupported(f"sliding-layer rope_type {local!r} (the provider's local RoPE is plain)")
    if full == "default":
        return 1.0
    return float(scaling["factor"]) if full == "linear" else unsupported(f"full-layer rope_type {full!r}")


def _megatron_layers(pattern: Any, m: MegatronGet) -> list[int]:
    """1 where the provider's layer is local (sliding window, local RoPE): layer_number % sum(pattern) != 0, layer
    numbers from 1 (provider _is_local_attn_layer, :349-354)."""
    size = sum(pattern)
    return [int((i + 1) % size != 0) for i in range(m("num_layers"))]


def _no(field: str, megatron: str = "num_layers") -> FieldRule:
    """A Gemma 2 / EmbeddingGemma knob the provider has no counterpart for: must be off (null / false)."""
    return FieldRule(
        megatron=megatron,
        hf=(field,),
        expect=lambda c, m: m(megatron) if not c.get(field) else unsupported(f"{field} {c.get(field)!r}"),
        note=f"{field} must be null / false (Megatron's Gemma 3 has no counterpart)",
    )


GEMMA_MLP_RULES: tuple[FieldRule, ...] = (
    FieldRule(
        megatron="activation_func",
        hf=("hidden_activation",),
        expect=lambda c, _m: (
            "fast_gelu" if c["hidden_activation"] == "gelu_pytorch_tanh" else unsupported(c["hidden_activation"])
        ),
        observe=function_name,
        note="HF's gelu_pytorch_tanh is megatron-core's fast_gelu (the tanh approximation)",
    ),
    implied("gated_linear_unit", True, "MLP is down(act(gate(x)) * up(x))"),
    same("tie_word_embeddings", "share_embeddings_and_output_weights"),
    same("attention_bias", "add_qkv_bias"),
)
"""The rules Gemma 3 and Gemma 4 share: the tanh GELU gated MLP, tied embeddings, the q/k/v bias flag."""

GEMMA3_TABLE: tuple[FieldRule, ...] = (
    same("num_hidden_layers", "num_layers"),
    same("hidden_size", "hidden_size"),
    same("intermediate_size", "ffn_hidden_size"),
    *HEADS_AND_VOCAB,
    same("max_position_embeddings", "seq_length"),
    same("rms_norm_eps", "layernorm_epsilon", note="the bridge's post norms ignore it (te-post-layernorm-default-eps)"),
    implied("normalization", "RMSNorm", "Gemma3RMSNorm everywhere (sandwich, q/k and final norms)"),
    implied("layernorm_zero_centered_gamma", True, "HF Gemma3RMSNorm multiplies by 1 + weight"),
    FieldRule(
        megatron="rotary_base",
        hf=(SLIDING, FULL),
        expect=_bases,
        observe=lambda v, _m: [float(b) for b in v] if isinstance(v, (tuple, list)) else [float(v)],
        also=("rope_theta", "rope_local_base_freq"),
        note="(local, global): sliding layers rotate with the local base, full layers with the global one",
    ),
    FieldRule(
        megatron="rope_scaling_factor",
        hf=(f"{FULL}.rope_type", f"{SLIDING}.rope_type"),
        expect=_global_factor,
        observe=lambda v, _m: float(v),
        also=("rope_scaling",),
        note="linear scaling of the global RoPE only",
    ),
    implied("position_embedding_type", "rope", "RoPE on q and k of every layer"),
    implied("rotary_percent", 1.0, "RoPE on every channel of a head"),
    implied("rotary_interleaved", False, "HF rotate_half pairs dimension i with i + d/2"),
    FieldRule(
        megatron="softmax_scale",
        hf=("query_pre_attn_scalar",),
        expect=lambda c, _m: 1.0 / math.sqrt(c["query_pre_attn_scalar"]),
        note="HF scales scores by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5",
    ),
    FieldRule(
        megatron="window_size",
        hf=("sliding_window",),
        expect=lambda c, _m: c.get("sliding_window"),
        note="the provider keeps W and its sliding layers attend through (W - 1, 0) (Gemma3TEDotProductAttention), "
        "HF's sliding layers to the last W positions, the query's own included",
    ),
    FieldRule(
        megatron="interleaved_attn_pattern",
        hf=("layer_types",),
        expect=hf_window_layers,
        observe=_megatron_layers,
        also=("sliding_window_pattern", "_sliding_window_pattern"),
        note="1 per sliding (local) layer: HF layer_types; the provider's (local, global) pattern, never read from "
        "the HF config",
    ),
    *GEMMA_MLP_RULES,
    implied("add_bias_linear", False, "Gemma 3 o_proj and MLP have no bias"),
    built_qk_norms("Gemma 3 attention always applies q_norm / k_norm (per head)"),
    implied("num_moe_experts", None, "dense architecture: no MoE layers"),
    same("attention_dropout", "attention_dropout", absent=0.0),
    implied("hidden_dropout", 0.0, "HF decoder layers have no hidden dropout"),
    _no("final_logit_softcapping"),
    _no("attn_logit_softcapping"),
    _no("use_bidirectional_attention"),
)
"""Every Gemma3TextConfig knob. The embedding's sqrt(hidden) scale is no config field: the logits oracle proves it."""


TINY_GEMMA3 = FixtureSpec(
    name="gemma3",
    config_class="Gemma3TextConfig",
    description="Gemma 3 text (published 1B structure, 4B+ global RoPE): 5 sliding layers then 1 global, window 8, "
    "local / global RoPE bases with linear 8 on the global one, sandwich norms, query_pre_attn_scalar 16, tied",
    config={
        **{key: value for key, value in TINY_SHAPES.items() if key != "tie_word_embeddings"},
        "num_hidden_layers": 6,
        "sliding_window": 8,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "query_pre_attn_scalar": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        },
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    },
)
"""Six layers are the fewest that keep the published 5:1 pattern (the bridge hard-codes it); query_pre_attn_scalar
differs from head_dim as in the 27B checkpoint, so a head_dim-scaled softmax is caught."""


LAYER_PATTERN_HARD_CODED = UpstreamBug(
    name="gemma3-layer-pattern-hard-coded",
    summary="the Gemma 3 bridge never reads layer_types (nor sliding_window_pattern): the provider's "
    "interleaved_attn_pattern stays (5, 1), so a checkpoint whose sliding / full layers follow another pattern is "
    "built with sliding windows and local RoPE on the wrong layers (published Gemma 3 checkpoints are 5:1)",
    where="megatron/bridge/models/gemma/gemma3_provider.py:73 (the default), :200 and :243 (read per layer), :349-354; "
    "gemma3_bridge.py provider_bridge sets no pattern",
    findings=(
        ("config", "layer_types -> interleaved_attn_pattern", "mismatch"),
        ("config", "layer_types (megatron_to_hf_config)", "roundtrip-mismatch"),
    ),
    seen_in=("0.6.2",),
)
"""Seen with `verify --model config:FILE` on the published 1B config with layer_types (sliding, full) x2: the config
oracle names the pattern (Megatron [1, 1, 1, 1] for HF's [1, 0, 1, 0]) and the exported layer_types; the logits differ
by 5.3, a finding te-post-layernorm-default-eps (listed first, and matched by oracle and kind alone) also claims."""


EXPORT_DROPS_GLOBAL_ROPE_SCALING = UpstreamBug(
    name="gemma3-export-drops-global-rope-scaling",
    summary="the Gemma 3 bridge exports the global RoPE's linear scaling as a legacy rope_scaling {factor, type: "
    "linear} beside top-level rope_theta / rope_local_base_freq; transformers 5 folds it into "
    "rope_parameters.full_attention with rope_type default (the stray `type` kept, not read), so the exported config "
    "rotates the global layers without the factor (the 4B-27B checkpoints' 8.0); weights are unaffected",
    where="megatron/bridge/models/gemma/gemma3_bridge.py:95-99 (megatron_to_hf_config); transformers 5.12.1 "
    "Gemma3TextConfig reads rope_type, not the legacy type",
    findings=(("config", "rope_parameters.full_attention.rope_type*(megatron_to_hf_config)", "roundtrip-mismatch"),),
    seen_in=("0.6.2",),
)
"""Seen on tiny:gemma3 (the global RoPE's linear factor 8.0) at TP2: exported rope_scaling_factor 1.0."""


CONFIG_EXPORT_WITHOUT_OVERRIDE = UpstreamBug(
    name="gemma3-config-export-drops-window-and-local-rope",
    summary="the 0.3.1-0.4.x Gemma 3 bridge has no megatron_to_hf_config of its own: the generic export writes neither "
    "sliding_window (transformers' default 4096 replaces the model's) nor the local RoPE base (the sliding layers' "
    "rope_parameters get the global rope_theta), so the exported config runs other attention windows and RoPE than "
    "the Megatron model; weights are unaffected",
    where="megatron/bridge/models/gemma/gemma3_bridge.py:48-123 (0.4.2: Gemma3ModelBridge overrides provider_bridge "
    "and mapping_registry only; 0.3.1 the same, its generic export, conversion/model_bridge.py:469-499, writing "
    "rotary_base's (local, global) pair as rope_theta); 0.5.0 adds megatron_to_hf_config (sliding_window and "
    "rope_local_base_freq exported)",
    findings=(
        ("config", "sliding_window (megatron_to_hf_config)", "roundtrip-mismatch"),
        ("config", "rope_parameters.sliding_attention*(megatron_to_hf_config)", "roundtrip-mismatch"),
    ),
    seen_in=("0.3.1", "0.4.0", "0.4.1", "0.4.2"),
    fixed_in="0.5.0",
)
"""Seen by `convcheck support` on bridge 0.4.2 (Gemma3ForCausalLM from transformers 5.3.0's default config, TP2):
exported sliding_window 4096 for the model's 8, and the sliding layers' RoPE differ; the bridge file is the same in
0.4.0-0.4.2. On bridge 0.3.1 (transformers 4.57.6's default config) the exported sliding_window is 4096 too and
rope_theta the pair [10000.0, 1000000.0], which no RoPE base reads."""


GEMMA3 = Architecture(
    hf_classes=("Gemma3ForCausalLM",),
    model_type="gemma3_text",
    mapping_rules="convcheck.models.gemma3_mappings:gemma3_rules",
    config_rules=GEMMA3_TABLE,
    fixtures=(TINY_GEMMA3,),
    upstream_bugs=(
        POST_LAYERNORM_DEFAULT_EPS,
        EXPORT_DROPS_GLOBAL_ROPE_SCALING,
        LAYER_PATTERN_HARD_CODED,
        CONFIG_EXPORT_WITHOUT_OVERRIDE,
    ),
)
