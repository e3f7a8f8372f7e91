"""Gemma 4 text (Gemma4ForCausalLM, model_type gemma4_text), its dense variants (E2B, E4B, 31B: enable_moe_block
false): config table, tiny fixture and the bridge bugs convcheck names. The bridge builds the dense variants from its
own local layer spec (gemma/modeling_gemma4.py:744 get_gemma4_layer_spec, LocalSpecProvider), whatever the provider's
layer spec says; their mappings are gemma4_mappings. The MoE variant (26B-A4B, enable_moe_block true) shares the
HF class and model_type: its fixture and known bug are convcheck.models.gemma4_moe, its rows of the one table here
(MOE_RULES), its mappings gemma4_mappings' MOE_BLOCK.

The table is megatron-bridge 0.6.2's gemma/gemma4_bridge.py _build_dense_provider / _build_moe_provider and
gemma4_provider.py Gemma4DenseProvider / Gemma4ModelProvider (cited as provider) against transformers 5.12.1's
models/gemma4/modeling_gemma4.py (cited as HF); each variant's rows are checked on its own configs (`variant`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.config_rules import (
    HEADS_AND_VOCAB,
    REQUIRED,
    FieldRule,
    HfView,
    MegatronGet,
    implied,
    same,
    unsupported,
)
from convcheck.models.fixture_spec import TINY_SHAPES, FixtureSpec
from convcheck.models.gemma3 import GEMMA_MLP_RULES
from convcheck.models.gemma4_05_bugs import (
    CONFIG_EXPORT_GENERIC,
    DENSE_BUILT_AS_MOE,
    K_EQ_V_NOT_READ,
    MOE_FUSED_WEIGHTS,
    MOE_LAYER_UNPATCHED,
)
from convcheck.models.gemma4_moe import MOE_POST_LAYERNORM_DEFAULT_EPS, TINY_GEMMA4_MOE
from convcheck.models.gpt_oss_config import hf_window_layers
from convcheck.models.upstream_bug import UpstreamBug

SLIDING, FULL = "sliding_attention", "full_attention"
ROPE_SLIDING, ROPE_FULL = f"rope_parameters.{SLIDING}", f"rope_parameters.{FULL}"
"""transformers 5 keeps one RoPE setting per layer type (Gemma4TextConfig.rope_parameters)."""


def _rope(c: HfView, kind: str, key: str, rope_type: str) -> Any:
    """`key` of the `kind` layers' RoPE settings; unsupported unless their rope_type is `rope_type` (the provider's
    sliding RoPE is plain, its full one proportional: modeling_gemma4.py:787-880)."""
    value = c.get(kind)
    settings = value if isinstance(value, dict) else {}
    given = settings.get("rope_type", "default")
    if given != rope_type:
        return unsupported(f"{kind} rope_type {given!r} (the provider's is {rope_type!r})")
    return float(settings[key]) if key in settings else unsupported(f"{kind} without {key}")


def _sliding_layers(value: Any, m: MegatronGet) -> list[int]:
    """1 where the provider's layer is sliding: window_attn_skip_freq as a per-layer list (bools or layer type
    names, modeling_gemma4.py:272-289), or an int N windowing every layer but each N-th."""
    layers = m("num_layers")
    if isinstance(value, list):
        return [int(v == SLIDING if isinstance(v, str) else bool(v)) for v in value]
    if isinstance(value, int) and value > 0:
        return [int((i + 1) % value != 0) for i in range(layers)]
    return [0] * layers


def _pattern_layers(pattern: Any, m: MegatronGet) -> list[int]:
    """1 where the MoE provider's layer is sliding: layer_number % sum(pattern) != 0, layer numbers from 1 (the
    (sliding, full) interleaved_attn_pattern as gemma3_provider.py:349-354 _is_local_attn_layer reads it)."""
    size = sum(pattern)
    return [int((i + 1) % size != 0) for i in range(m("num_layers"))]


def _off(field: str, megatron: str = "num_layers", why: str = "") -> FieldRule:
    """A knob of another Gemma 4 variant the dense provider has no counterpart for: must be off (null / false)."""
    return FieldRule(
        megatron=megatron,
        hf=(field,),
        expect=lambda c, m: m(megatron) if not c.get(field) else unsupported(f"{field} {c.get(field)!r}{why}"),
        note=f"{field} must be null / false{why}",
    )


NOT_THIS_VARIANT = "<a rule of the other variant>"
"""What a rule of one variant expects and observes on a model of the other (always equal: nothing to check)."""


def hf_moe(c: HfView) -> bool:
    """Whether the HF config is the MoE variant (enable_moe_block)."""
    return bool(c.get("enable_moe_block"))


def built_moe(m: MegatronGet) -> bool:
    """Whether the bridge built the MoE variant (Gemma4ModelProvider sets num_moe_experts, the dense provider None)."""
    return m("num_moe_experts") is not None


def variant(rule: FieldRule, *, moe: bool) -> FieldRule:
    """`rule` for one variant only: checked where the HF config is that variant (enable_moe_block, `when`), and there
    observed only on that variant's provider (a model the bridge built as the other variant fails the rule); a field
    the other variant's provider lacks is read as None."""
    return replace(
        rule,
        expect=lambda c, m: rule.expect(c, m) if hf_moe(c) == moe else NOT_THIS_VARIANT,
        observe=lambda v, m: rule.observe(v, m) if built_moe(m) == moe else NOT_THIS_VARIANT,
        missing=None if rule.missing is REQUIRED else rule.missing,
        when=lambda c: hf_moe(c) == moe,
    )


def dense(*rules: FieldRule) -> tuple[FieldRule, ...]:
    return tuple(variant(rule, moe=False) for rule in rules)


def moe(*rules: FieldRule) -> tuple[FieldRule, ...]:
    return tuple(variant(rule, moe=True) for rule in rules)


def _global_kv_heads(c: HfView, _m: MegatronGet) -> Any:
    """KV heads of HF's full-attention layers: num_global_key_value_heads where they use keys as values, else
    num_key_value_heads (HF Gemma4TextAttention.__init__, `use_alternative_attention`)."""
    if c.get("attention_k_eq_v") and c.get("num_global_key_value_heads"):
        return c["num_global_key_value_heads"]
    return c["num_key_value_heads"]


DENSE_RULES: tuple[FieldRule, ...] = dense(
    same("intermediate_size", "ffn_hidden_size", note="the KV-shared layers of a double-wide model take twice it"),
    same("global_head_dim", "global_kv_channels", note="head width of the full-attention layers"),
    FieldRule(
        megatron="num_global_query_groups",
        hf=("num_global_key_value_heads",),
        expect=_global_kv_heads,
        observe=lambda v, m: m("num_query_groups") if v is None else v,
        note="KV heads of the full-attention layers (HF: num_global_key_value_heads where they use keys as values, "
        "else num_key_value_heads; the provider keeps a null, which Gemma4DenseSelfAttention reads as "
        "num_query_groups, and reads a set value whatever attention_k_eq_v says, modeling_gemma4.py:310-311)",
    ),
    same("num_kv_shared_layers", "num_kv_shared_layers", absent=0, note="the last N layers read earlier layers' KV"),
    same("use_double_wide_mlp", "use_double_wide_mlp", absent=False),
    same("hidden_size_per_layer_input", "per_layer_embed_dim", note="per-layer input embedding width (0: none)"),
    same("vocab_size_per_layer_input", "per_layer_embed_vocab_size"),
    implied("scale_embeddings_by_hidden_size", True, "HF Gemma4TextScaledWordEmbedding scales by sqrt(hidden)"),
    FieldRule(
        megatron="sliding_window_rope_base",
        hf=(ROPE_SLIDING,),
        expect=lambda c, _m: _rope(c, ROPE_SLIDING, "rope_theta", "default"),
        observe=lambda v, _m: float(v),
        note="the sliding layers rotate every channel with the local base",
    ),
    FieldRule(
        megatron="full_attention_rope_base",
        hf=(ROPE_FULL,),
        expect=lambda c, _m: _rope(c, ROPE_FULL, "rope_theta", "proportional"),
        observe=lambda v, _m: float(v),
        note="the full layers rotate with the global base",
    ),
    FieldRule(
        megatron="full_attention_rope_partial_factor",
        hf=(f"{ROPE_FULL}.partial_rotary_factor",),
        expect=lambda c, _m: _rope(c, ROPE_FULL, "partial_rotary_factor", "proportional"),
        observe=lambda v, _m: float(v),
        note="proportional RoPE: the first factor * d / 2 frequency pairs rotate, the rest are zero frequencies",
    ),
    FieldRule(
        megatron="window_attn_skip_freq",
        hf=("layer_types",),
        expect=hf_window_layers,
        observe=_sliding_layers,
        note="1 per sliding layer: HF layer_types",
    ),
    _off("num_experts", why=" (read only with enable_moe_block)"),
    _off("top_k_experts", why=" (read only with enable_moe_block)"),
    _off("moe_intermediate_size", why=" (read only with enable_moe_block)"),
)
"""The dense provider's fields (Gemma4DenseProvider, gemma4_bridge.py:207-255)."""


MOE_RULES: tuple[FieldRule, ...] = moe(
    same("intermediate_size", "moe_shared_expert_intermediate_size", note="the dense MLP beside the experts"),
    same("num_experts", "num_moe_experts"),
    same("top_k_experts", "moe_router_topk"),
    same("moe_intermediate_size", "moe_ffn_hidden_size"),
    implied("moe_layer_freq", 1, "every Gemma 4 MoE layer has the experts beside its dense MLP"),
    implied("moe_shared_expert_gate", False, "HF adds the dense MLP's normed output ungated"),
    implied("moe_router_score_function", "softmax", "HF Gemma4TextRouter: softmax over all experts, then top-k"),
    implied("moe_router_enable_expert_bias", False, "HF's router has no expert bias"),
    implied("moe_expert_capacity_factor", None, "HF drops no token"),
    FieldRule(
        megatron="moe_router_topk_scaling_factor",
        expect=lambda _c, _m: 1.0,
        observe=lambda v, _m: 1.0 if v is None else float(v),
        note="HF renormalises the top-k weights to sum 1 and scales them by per_expert_scale alone "
        "(Gemma4TopKRouter.routing does the same, modeling_gemma4.py:1392-1406)",
    ),
    same("global_head_dim", "global_head_dim", note="head width of the full-attention layers"),
    FieldRule(
        megatron="num_global_key_value_heads",
        hf=("num_global_key_value_heads",),
        expect=_global_kv_heads,
        observe=lambda v, m: m("num_query_groups") if v is None else v,
        note="KV heads of the full-attention layers: HF reads num_global_key_value_heads only where they use keys as "
        "values; Gemma4SelfAttention reads it wherever it is set (modeling_gemma4.py:1558-1560)",
    ),
    FieldRule(
        megatron="model.embedding.__class__.__name__",
        expect=lambda _c, _m: "Gemma3LanguageModelEmbedding",
        note="HF Gemma4TextScaledWordEmbedding scales by sqrt(hidden); the MoE provider's embedding does "
        "(gemma4_provider.py:345-352, gemma3_provider.py:278-282)",
    ),
    FieldRule(
        megatron="rotary_base",
        hf=(ROPE_SLIDING, ROPE_FULL),
        expect=lambda c, _m: [
            _rope(c, ROPE_SLIDING, "rope_theta", "default"),
            _rope(c, ROPE_FULL, "rope_theta", "proportional"),
        ],
        observe=lambda v, _m: [float(b) for b in v] if isinstance(v, (tuple, list)) else [float(v)],
        note="(local, global): the sliding layers rotate every channel with the local base, the full ones with the "
        "global base",
    ),
    FieldRule(
        megatron="global_rotary_percent",
        hf=(f"{ROPE_FULL}.partial_rotary_factor",),
        expect=lambda c, _m: _rope(c, ROPE_FULL, "partial_rotary_factor", "proportional"),
        observe=lambda v, _m: float(v),
        note="proportional RoPE: the first factor * d / 2 frequency pairs rotate, the rest are zero frequencies "
        "(Gemma4RotaryEmbedding, modeling_gemma4.py:1754-1789)",
    ),
    FieldRule(
        megatron="interleaved_attn_pattern",
        hf=("layer_types",),
        expect=hf_window_layers,
        observe=_pattern_layers,
        note="1 per sliding layer: HF layer_types; the provider's (sliding, full) pattern, inferred from the first "
        "full layer (gemma4_bridge.py:83-95) and read as layer_number % sum(pattern) != 0 (gemma3_provider.py:349-354)",
    ),
    _off("num_kv_shared_layers", why=" (the MoE provider builds no KV sharing)"),
    _off("use_double_wide_mlp", why=" (the MoE provider's MLPs are intermediate_size wide)"),
    _off("hidden_size_per_layer_input", why=" (the MoE provider builds no per-layer inputs)"),
)
"""The MoE provider's fields (Gemma4ModelProvider, gemma4_bridge.py:257-301). vocab_size_per_layer_input is read
only with per-layer inputs, which the MoE variant must not have (hidden_size_per_layer_input 0)."""


GEMMA4_TABLE: tuple[FieldRule, ...] = (
    same("num_hidden_layers", "num_layers"),
    same("hidden_size", "hidden_size"),
    *HEADS_AND_VOCAB,
    same("attention_k_eq_v", "attention_k_eq_v", absent=False, note="full layers use their keys as values"),
    same("final_logit_softcapping", "final_logit_softcapping", note="cap * tanh(logits / cap) on the output"),
    same("max_position_embeddings", "seq_length"),
    same(
        "rms_norm_eps",
        "layernorm_epsilon",
        note="the MoE variant's post-attention norm ignores it (te-post-layernorm-default-eps)",
    ),  # fmt: skip
    implied("normalization", "RMSNorm", "Gemma4RMSNorm everywhere (sandwich, q/k, per-layer and final norms)"),
    implied("layernorm_zero_centered_gamma", False, "HF Gemma4RMSNorm multiplies by the weight itself"),
    implied("position_embedding_type", "rope", "RoPE on q and k of every layer"),
    implied("rotary_percent", 1.0, "the sliding layers rotate every channel of a head"),
    implied("rotary_interleaved", False, "HF rotate_half pairs dimension i with i + d/2"),
    FieldRule(
        megatron="softmax_scale",
        expect=lambda _c, _m: 1.0,
        observe=lambda v, _m: 1.0 if v is None else float(v),
        note="HF Gemma4TextAttention scales scores by 1.0 (q / k are normed); Gemma4DenseSelfAttention uses 1.0 "
        "where the config says None (modeling_gemma4.py:302)",
    ),
    FieldRule(
        megatron="window_size",
        hf=("sliding_window",),
        expect=lambda c, _m: c["sliding_window"] if hf_moe(c) else [c["sliding_window"] - 1, 0],
        observe=lambda v, _m: list(v) if isinstance(v, (tuple, list)) else v,
        note="HF's sliding layers attend to the last W positions, the query's own included: the dense provider's "
        "(W - 1, 0); the MoE provider keeps W and its sliding layers attend through (W - 1, 0) "
        "(Gemma4TEDotProductAttention, modeling_gemma4.py:1726-1751)",
    ),
    *GEMMA_MLP_RULES,
    implied("add_bias_linear", False, "Gemma 4 o_proj and MLP have no bias"),
    FieldRule(
        megatron="num_moe_experts",
        hf=("enable_moe_block",),
        expect=lambda c, _m: c.get("num_experts") if hf_moe(c) else None,
        note="the MoE variant (Gemma4ModelProvider) has num_experts experts in every layer, the dense one none",
    ),
    same("attention_dropout", "attention_dropout", absent=0.0),
    implied("hidden_dropout", 0.0, "HF decoder layers have no hidden dropout"),
    _off("use_bidirectional_attention", why=" (the bridge builds causal attention only)"),
    *DENSE_RULES,
    *MOE_RULES,
)
"""Every Gemma4TextConfig knob of the dense and MoE variants. The embedding's sqrt(hidden) scale, the value norm and the
per-layer input scales are no config fields: the logits oracle proves them."""

TINY_GEMMA4 = FixtureSpec(
    name="gemma4",
    config_class="Gemma4TextConfig",
    description="Gemma 4 text, dense (E2B / E4B / 31B knobs together): (2 sliding, 1 full) x2, window 8, head_dim 8 "
    "sliding / 16 full, proportional partial RoPE 0.25 on full layers, keys as values on full layers, the last 2 "
    "layers sharing KV with double-wide MLPs, per-layer input embeddings of 4, sandwich norms, softcap 0.5, tied",
    config={
        **{key: value for key, value in TINY_SHAPES.items() if key != "tie_word_embeddings"},
        "num_hidden_layers": 6,
        "layer_types": [SLIDING, SLIDING, FULL] * 2,
        "sliding_window": 8,
        "global_head_dim": 16,
        "num_global_key_value_heads": 2,
        "attention_k_eq_v": True,
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "hidden_size_per_layer_input": 4,
        "vocab_size": 128,
        "vocab_size_per_layer_input": 128,
        "final_logit_softcapping": 0.5,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
            FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    },
)
"""The final softcap is 0.5, not the published 30: the tiny model's logits reach about 1, where 0.5 * tanh(x / 0.5)
bends them (30 would leave them as they are), so the logits oracle sees the cap. The vocabulary is a multiple of 128
as published (262144): the provider pads the embedding to one itself (gemma4-dense-vocab-padded). Six layers in two
(sliding, sliding, full) periods: the KV-shared last two (a sliding and a full one) each have an earlier layer of
their kind to share from (HF Gemma4TextAttention.kv_shared_layer_index)."""


SHARED_KV_K_NORM_UNMAPPED = UpstreamBug(
    name="gemma4-shared-kv-k-norm-unmapped",
    summary="the Gemma 4 dense model builds a k_layernorm in every layer (modeling_gemma4.py:304 forces "
    "qk_layernorm), and the bridge maps each to the HF layer's self_attn.k_norm, which the KV-shared layers (the last "
    "num_kv_shared_layers) do not have: the import leaves those k_layernorm weights at their initial value; the "
    "forward never reads them (those layers take an earlier layer's normed keys)",
    where="megatron/bridge/models/gemma/gemma4_bridge.py:453 (_dense_mapping_registry); "
    "gemma/modeling_gemma4.py:304 and :758",
    findings=(
        ("coverage", "decoder.layers.*.self_attention.k_layernorm.weight", "hf-missing"),
        ("coverage", "decoder.layers.*.self_attention.k_layernorm.weight", "not-loaded"),
        ("mapping", "decoder.layers.*.self_attention.k_layernorm.weight", "uncovered"),
    ),
    seen_in=("0.6.2",),
)
"""Seen on tiny:gemma4 (layers 4 and 5 share KV) at TP1 and TP2: coverage names their k_layernorm, mapped to an HF
tensor the checkpoint does not contain and never written; convcheck's mappings have none to give it."""


DENSE_PP_REFUSED = UpstreamBug(
    name="gemma4-dense-pipeline-refused",
    summary="the Gemma 4 dense provider refuses any pipeline-parallel layout (NotImplementedError: PP=1 only), so "
    "E2B / E4B / 31B cannot be built or trained at PP > 1",
    where="megatron/bridge/models/gemma/gemma4_provider.py:199-200 (Gemma4DenseProvider.provide)",
    findings=(("*", "<build>", "build-failed"),),
    message_contains="PP=1 only",
    seen_in=("0.6.2",),
)
"""Seen on tiny:gemma4 at PP2: every oracle fails on the build, naming gemma4_provider.py:200."""


DENSE_VOCAB_PADDED = UpstreamBug(
    name="gemma4-dense-vocab-padded",
    summary="the Gemma 4 dense provider pads the vocabulary to a multiple of 128 when it builds the model "
    "(make_vocab_size_divisible_by 128, never set from the checkpoint as the generic provider path does), so a "
    "checkpoint whose vocab_size is no multiple of 128 gets a larger embedding than its own and the import raises "
    "on the embedding's shape: nothing is loaded (published vocabularies, 262144, are multiples of 128)",
    where="megatron/bridge/models/gemma/gemma4_bridge.py:230 (_build_dense_provider passes no "
    "make_vocab_size_divisible_by; compare models/conversion/model_bridge.py:615-618); gemma4_provider.py:140 and "
    ":218-221",
    findings=(
        ("config", "vocab_size -> model.vocab_size", "mismatch"),
        ("coverage", "<import>", "import-failed"),
    ),
    consequences=(
        ("coverage", "*", "not-loaded"),
        ("roundtrip", "*", "bytes-differ"),
        ("roundtrip", "*", "shape"),
        ("logits", "*", "logits-differ"),
        ("logits", "*", "greedy-differs"),
        ("elements", "*", "shape"),
        ("layout", "*", "tp1-differs-from-source"),
        ("mapping", "*", "import-bytes-differ"),
        ("mapping", "*", "import-shape"),
        ("mapping", "*", "mapping-error"),
    ),
    seen_in=("0.6.2",),
)
"""Seen by hand on tiny:gemma4's config with vocab_size 152 (`verify --model config:FILE`, TP1): config names
model.vocab_size 256 for 152 and the import raises on embedding.word_embeddings.weight; every other finding follows
(bench/results/cpu-gemma4-2026-12-07.json)."""


GEMMA4 = Architecture(
    hf_classes=("Gemma4ForCausalLM",),
    model_type="gemma4_text",
    mapping_rules="convcheck.models.gemma4_mappings:gemma4_rules",
    config_rules=GEMMA4_TABLE,
    fixtures=(TINY_GEMMA4, TINY_GEMMA4_MOE),
    upstream_bugs=(
        SHARED_KV_K_NORM_UNMAPPED,
        DENSE_PP_REFUSED,
        DENSE_VOCAB_PADDED,
        MOE_POST_LAYERNORM_DEFAULT_EPS,
        DENSE_BUILT_AS_MOE,
        MOE_LAYER_UNPATCHED,
        MOE_FUSED_WEIGHTS,
        K_EQ_V_NOT_READ,
        CONFIG_EXPORT_GENERIC,
    ),
)
