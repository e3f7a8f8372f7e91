"""Corresponding HF config fields and Megatron TransformerConfig fields, per architecture (data, not logic).

Each `FieldRule` says which HF fields (dotted for nested dicts, as `to_dict()` spells them) determine one
Megatron field and what value that field must hold. A rule without HF fields states what the architecture
implies (Qwen3 attention always normalises q and k). New architectures add a table keyed by `model_type`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

HfView = Mapping[str, Any]
"""The HF config flattened one level (`rope_parameters.rope_theta`), class defaults filled in."""
MegatronGet = Callable[[str], Any]
"""Reads a Megatron field: a TransformerConfig attribute, or `model.X` on the first model chunk."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldRule:
    """One Megatron field and the HF fields it must reproduce."""

    megatron: str
    """TransformerConfig attribute (or `model.ATTR` for an attribute of the built GPTModel)."""
    expect: Callable[[HfView, MegatronGet], Any]
    """The value the Megatron field must hold, computed from the HF config (canonical form)."""
    hf: tuple[str, ...] = ()
    """HF fields this rule covers; empty when the value is implied by the architecture."""
    observe: Callable[[Any, MegatronGet], Any] = lambda value, _m: value
    """Megatron value -> canonical form compared with `expect` (e.g. a function -> its name)."""
    note: str = ""
    """Why the correspondence holds (shown in findings)."""

    @property
    def label(self) -> str:
        """`hf_field -> megatron_field`, the name a finding carries."""
        return f"{'+'.join(self.hf) or '<implied>'} -> {self.megatron}"


def same(hf: str, megatron: str, absent: Any = None, note: str = "") -> FieldRule:
    """The Megatron field equals the HF field (`absent` when the HF config has no such field)."""
    return FieldRule(megatron=megatron, hf=(hf,), expect=lambda c, _m: c.get(hf, absent), note=note)


def implied(megatron: str, value: Any, note: str) -> FieldRule:
    """The architecture fixes the Megatron field to `value` whatever the HF config says."""
    return FieldRule(megatron=megatron, expect=lambda _c, _m: value, note=note)


def _unsupported(what: str) -> str:
    return f"<not representable: {what}>"


def _rope_type(c: HfView, _m: MegatronGet) -> str:
    kind = c.get("rope_parameters.rope_type", "default")
    return {"default": "rope", "yarn": "yarn"}.get(kind, _unsupported(f"rope_type {kind!r}"))


def _window(c: HfView, _m: MegatronGet) -> Any:
    types = c.get("layer_types") or []
    if c.get("use_sliding_window") or any(t != "full_attention" for t in types):
        return _unsupported("sliding-window attention layers")
    return None


def _padded_vocab(c: HfView, m: MegatronGet) -> int:
    vocab = c["vocab_size"]
    if not m("should_pad_vocab"):
        return vocab
    multiple = m("make_vocab_size_divisible_by") * m("tensor_model_parallel_size")
    return -(-vocab // multiple) * multiple


def _moe_layers(c: HfView, _m: MegatronGet) -> list[int]:
    """1 where HF builds a sparse MoE block (Qwen3MoeDecoderLayer's rule), else 0."""
    step, dense = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers") or [])
    experts = c["num_local_experts"]
    return [int(i not in dense and experts > 0 and (i + 1) % step == 0) for i in range(c["num_hidden_layers"])]


def _megatron_moe_layers(freq: Any, m: MegatronGet) -> Any:
    """Megatron's moe_layer_freq as a per-layer 0/1 list (an int N means every N-th layer from 0)."""
    return [int(i % freq == 0) for i in range(m("num_layers"))] if isinstance(freq, int) else list(freq)


def _fn_name(value: Any, _m: MegatronGet) -> str:
    return getattr(value, "__name__", repr(value))


_HEADS_AND_VOCAB = (
    same("num_attention_heads", "num_attention_heads"),
    same("num_key_value_heads", "num_query_groups", note="GQA groups"),
    FieldRule(
        megatron="kv_channels",
        hf=("head_dim",),
        expect=lambda c, _m: c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
    ),
    same("vocab_size", "vocab_size"),
    FieldRule(
        megatron="model.vocab_size",
        hf=("vocab_size",),
        expect=_padded_vocab,
        note="embedding / output rows: the HF vocab, padded only when should_pad_vocab",
    ),
)
"""Attention heads, KV groups, head_dim and vocabulary (with padding): the same rule for every architecture."""


_SHAPES = (
    same("num_hidden_layers", "num_layers"),
    same("hidden_size", "hidden_size"),
    same("intermediate_size", "ffn_hidden_size"),
    *_HEADS_AND_VOCAB,
    same("max_position_embeddings", "seq_length"),
)
_NORM_ROPE_ACT = (
    same("rms_norm_eps", "layernorm_epsilon"),
    implied("normalization", "RMSNorm", "RMSNorm everywhere (input, post-attention, final, q/k norms)"),
    implied("layernorm_zero_centered_gamma", False, "HF RMSNorm multiplies by weight, not 1 + weight"),
    FieldRule(
        megatron="rotary_base", hf=("rope_parameters.rope_theta",), expect=lambda c, _m: c["rope_parameters.rope_theta"]
    ),
    FieldRule(megatron="position_embedding_type", hf=("rope_parameters.rope_type",), expect=_rope_type),
    FieldRule(
        megatron="rotary_percent",
        hf=("partial_rotary_factor", "rope_parameters.partial_rotary_factor"),
        expect=lambda c, _m: c.get("rope_parameters.partial_rotary_factor", c.get("partial_rotary_factor", 1.0)),
    ),
    implied("rotary_interleaved", False, "HF rotate_half pairs dimension i with i + d/2"),
    implied("rope_scaling", False, "rope_type default: no Llama-3 frequency scaling"),
    implied("softmax_scale", None, "attention scale 1/sqrt(head_dim) as in HF"),
    FieldRule(megatron="activation_func", hf=("hidden_act",), expect=lambda c, _m: c["hidden_act"], observe=_fn_name),
    implied("gated_linear_unit", True, "MLP is down(act(gate(x)) * up(x))"),
    same("tie_word_embeddings", "share_embeddings_and_output_weights"),
    FieldRule(megatron="window_size", hf=("layer_types", "use_sliding_window", "sliding_window"), expect=_window),
    same("attention_dropout", "attention_dropout", absent=0.0),
    implied("hidden_dropout", 0.0, "HF decoder layers have no hidden dropout"),
)
_DENSE = (implied("num_moe_experts", None, "dense architecture: no MoE layers"),)

QWEN2 = (
    *_SHAPES,
    *_NORM_ROPE_ACT,
    *_DENSE,
    implied("add_qkv_bias", True, "Qwen2 q/k/v projections always carry a bias"),
    implied("add_bias_linear", False, "Qwen2 o_proj and MLP have no bias"),
    implied("qk_layernorm", False, "Qwen2 has no q/k norm"),
)
QWEN3 = (
    *_SHAPES,
    *_NORM_ROPE_ACT,
    *_DENSE,
    same("attention_bias", "add_qkv_bias"),
    implied("add_bias_linear", False, "Qwen3 o_proj and MLP have no bias"),
    implied("qk_layernorm", True, "Qwen3 attention always applies q_norm / k_norm"),
)
QWEN3_MOE = (
    *_SHAPES,
    *_NORM_ROPE_ACT,
    same("attention_bias", "add_qkv_bias"),
    implied("add_bias_linear", False, "Qwen3-MoE o_proj and experts have no bias"),
    implied("qk_layernorm", True, "Qwen3-MoE attention always applies q_norm / k_norm"),
    same("num_local_experts", "num_moe_experts"),
    same("num_experts_per_tok", "moe_router_topk"),
    same("moe_intermediate_size", "moe_ffn_hidden_size"),
    FieldRule(
        megatron="moe_router_pre_softmax",
        hf=("norm_topk_prob",),
        expect=lambda c, _m: not c["norm_topk_prob"],
        note="HF softmaxes all experts then renormalises the top-k iff norm_topk_prob; Megatron softmaxes the "
        "top-k (same result) unless pre_softmax",
    ),
    implied("moe_router_score_function", "softmax", "HF router: softmax over expert logits"),
    implied("moe_router_topk_scaling_factor", None, "HF applies no routed scaling factor"),
    implied("moe_router_enable_expert_bias", False, "HF router has no expert bias"),
    implied("moe_shared_expert_intermediate_size", None, "Qwen3-MoE has no shared expert"),
    FieldRule(
        megatron="moe_layer_freq",
        hf=("decoder_sparse_step", "mlp_only_layers", "num_local_experts"),
        expect=_moe_layers,
        observe=_megatron_moe_layers,
        note="per-layer MoE pattern",
    ),
    same("router_aux_loss_coef", "moe_aux_loss_coeff", note="training only"),
)
LLAMA = (
    *_SHAPES,
    *_NORM_ROPE_ACT,
    *_DENSE,
    same("attention_bias", "add_qkv_bias"),
    FieldRule(
        megatron="add_bias_linear",
        hf=("mlp_bias", "attention_bias"),
        expect=lambda c, _m: (
            c["mlp_bias"] if c["mlp_bias"] == c["attention_bias"] else _unsupported("o_proj bias != mlp bias")
        ),
    ),
    implied("qk_layernorm", False, "Llama has no q/k norm"),
)

_MIXERS = "model.decoder.layers.*.mixer"
"""Every local Mamba mixer of a HybridModel (attention / MLP / MoE layers have no `mixer`)."""
_PATTERN_CHARS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _pattern(c: HfView, _m: MegatronGet) -> str:
    """HF layers_block_type as Megatron's hybrid layer pattern (M mamba, * attention, - MLP, E MoE)."""
    types = c["layers_block_type"]
    return "".join(_PATTERN_CHARS.get(t, _unsupported(f"layer type {t!r}")) for t in types)


def _megatron_pattern(value: Any, _m: MegatronGet) -> Any:
    """Main-decoder part of a Megatron hybrid pattern: pipeline stage marks `|` dropped, MTP part after `/` cut."""
    return value.split("/")[0].replace("|", "") if isinstance(value, str) else value


def per_mixer(attr: str, hf: tuple[str, ...], value: Callable[[HfView], Any], note: str = "") -> FieldRule:
    """Every local Mamba mixer's `attr` (a MambaMixer attribute) holds value(hf config)."""
    return FieldRule(
        megatron=f"{_MIXERS}.{attr}",
        hf=hf,
        expect=lambda c, m: [value(c)] * len(m(_MIXERS)),
        note=note,
    )


def _mtp_pattern(c: HfView, _m: MegatronGet) -> Any:
    if not c.get("num_nextn_predict_layers"):
        return None
    return "".join(_PATTERN_CHARS[t] for t in c["mtp_layers_block_type"])


def _router_topk(c: HfView, _m: MegatronGet) -> Any:
    topk = c["num_experts_per_tok"]
    if topk > 1 and not c["norm_topk_prob"]:
        return _unsupported("unnormalised sigmoid top-k weights (norm_topk_prob false)")
    return topk


def _linear_bias(c: HfView, _m: MegatronGet) -> Any:
    if c["mlp_bias"] or c["use_bias"]:
        return _unsupported("MLP / Mamba projection biases (HF o_proj never has one, Megatron's linear_proj would)")
    return False


NEMOTRON_H = (
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
    *_HEADS_AND_VOCAB,
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
        expect=lambda c, _m: {"relu2": "squared_relu"}.get(c["mlp_hidden_act"], _unsupported(c["mlp_hidden_act"])),
        observe=_fn_name,
        note="MLP and experts: down(act(up(x)))",
    ),
    implied("gated_linear_unit", False, "NemotronH MLP and experts are not gated"),
    same("tie_word_embeddings", "share_embeddings_and_output_weights"),
    FieldRule(
        megatron="window_size",
        hf=("sliding_window",),
        expect=lambda c, _m: None if c.get("sliding_window") is None else _unsupported("sliding-window attention"),
    ),
    same("attention_dropout", "attention_dropout", absent=0.0),
    same("hidden_dropout", "hidden_dropout", absent=0.0),
    same("residual_in_fp32", "fp32_residual_connection"),
    # Mamba-2 mixers
    same("mamba_num_heads", "mamba_num_heads"),
    same("mamba_head_dim", "mamba_head_dim"),
    same("n_groups", "mamba_num_groups"),
    same("ssm_state_size", "mamba_state_dim"),
    same("chunk_size", "mamba_chunk_size", note="scan block length; the computed function does not depend on it"),
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
        lambda c: c["mamba_hidden_act"] if c["mamba_hidden_act"] in ("silu", "swish") else _unsupported("act"),
        note="conv activation; megatron-core 0.19.2 always uses silu",
    ),
    FieldRule(
        megatron=f"{_MIXERS}.conv1d_bias",
        hf=("use_conv_bias",),
        expect=lambda c, m: [c["use_conv_bias"]] * len(m(_MIXERS)),
        observe=lambda value, _m: [bias is not None for bias in value],
        note="True when the mixer has a conv bias",
    ),
    FieldRule(
        megatron=_MIXERS,
        hf=("time_step_limit",),
        expect=lambda c, m: (
            ["(0, inf)" if tuple(c["time_step_limit"]) == (0.0, float("inf")) else _unsupported("a dt clamp")]
            * len(m(_MIXERS))
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
        expect=lambda c, _m: 1 if c["n_group"] == 1 else _unsupported("group-limited routing (n_group > 1)"),
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

TABLES: dict[str, tuple[FieldRule, ...]] = {
    "qwen2": QWEN2,
    "qwen3": QWEN3,
    "qwen3_moe": QWEN3_MOE,
    "llama": LLAMA,
    "nemotron_h": NEMOTRON_H,
}
"""model_type -> rules."""

IGNORED: dict[str, str] = {
    "_name_or_path": "where the config was read from",
    "architectures": "selects the bridge class (the bridge registry checks it)",
    "model_type": "selects this table",
    "transformers_version": "writer metadata",
    "dtype": "storage dtype of the weights (the roundtrip oracle compares dtypes bitwise)",
    "torch_dtype": "storage dtype of the weights (the roundtrip oracle compares dtypes bitwise)",
    "use_cache": "HF generation KV cache switch",
    "bos_token_id": "tokenizer / generation metadata",
    "eos_token_id": "tokenizer / generation metadata",
    "pad_token_id": "tokenizer / generation metadata",
    "initializer_range": "random init only (weights are loaded)",
    "output_router_logits": "HF returns router logits for the aux loss; no effect on the forward output",
    "max_window_layers": "read only when use_sliding_window is true (covered by window_size)",
    "time_step_min": "dt_bias init range (HF's torch slow path also clamps dt below it; its kernel path does not)",
    "time_step_max": "dt_bias init range",
    "time_step_floor": "dt_bias init floor",
    "rescale_prenorm_residual": "random init only (weights are loaded)",
    "use_mamba_kernels": "HF switch between its CUDA kernels and its torch path (same function)",
    "mamba_ssm_cache_dtype": "HF generation cache dtype",
    "mamba_proj_bias": "not read by HF NemotronH (Mamba projection biases follow use_bias)",
    "moe_shared_expert_overlap": "Megatron scheduling of the shared expert (no effect on the computed function)",
    "num_logits_to_keep": "HF generation: how many positions return logits",
}
"""HF fields that do not describe the computed function, with the reason; every other field needs a rule."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Coverage:
    """What a table covers: rules plus ignored fields (a field is covered if it or its parent is named)."""

    rules: tuple[FieldRule, ...]
    ignored: dict[str, str] = field(default_factory=lambda: dict(IGNORED))

    def covers(self, hf_field: str) -> bool:
        """True when a rule or the ignore list names `hf_field` or the dict it sits in."""
        named = {f for r in self.rules for f in r.hf} | set(self.ignored)
        return hf_field in named or hf_field.split(".", 1)[0] in named
