"""The config oracle's vocabulary: HF fields <-> one Megatron TransformerConfig field, as data (no torch).

Each `FieldRule` says which HF fields (dotted for nested dicts, as `to_dict()` spells them) determine one
Megatron field and what value that field must hold. A rule without HF fields states what the architecture
implies (Qwen3 attention always normalises q and k). Each architecture's table lives in its family module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from convcheck.hf.geometry import Geometry

HfView = Mapping[str, Any]
"""The HF config flattened one level (`rope_parameters.rope_theta`), class defaults filled in."""
MegatronGet = Callable[[str], Any]
"""Reads a Megatron field: a TransformerConfig attribute, or `model.X` on the first model chunk."""


REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()
"""FieldRule.missing of a field every Megatron config must have."""


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
    also: tuple[str, ...] = ()
    """The same HF fields as other transformers releases spell them (read where `hf` is absent; covered, unlabelled)."""
    missing: Any = REQUIRED
    """The value a Megatron config without the field means (a field older megatron-core releases lack); REQUIRED: a
    config without it is unreadable."""
    when: Callable[[HfView], bool] | None = None
    """HF config -> whether the rule is checked on it (a rule of one variant of a model_type, Gemma 4's dense or MoE
    one); None: always. Coverage counts its fields either way."""

    @property
    def label(self) -> str:
        """`hf_field -> megatron_field`, the name a finding carries."""
        return f"{'+'.join(self.hf) or '<implied>'} -> {self.megatron}"


def same(hf: str, megatron: str, absent: Any = None, note: str = "", also: tuple[str, ...] = ()) -> FieldRule:
    """The Megatron field equals the HF field, or its first spelling in `also` (`absent` when there is none)."""
    names = (hf, *also)
    return FieldRule(megatron=megatron, hf=(hf,), expect=lambda c, _m: first(c, names, absent), note=note, also=also)


def first(c: HfView, names: tuple[str, ...], absent: Any = None) -> Any:
    """The value of the first of `names` the HF view has (one field spelt differently across transformers releases)."""
    return next((c[name] for name in names if name in c), absent)


def implied(megatron: str, value: Any, note: str) -> FieldRule:
    """The architecture fixes the Megatron field to `value` whatever the HF config says."""
    return FieldRule(megatron=megatron, expect=lambda _c, _m: value, note=note)


QK_NORMS = "model.decoder.layers.*.self_attention.q_layernorm"
"""Every built decoder layer's q norm (its k norm read beside it): what `built_qk_norms` observes."""


def built_qk_norms(note: str, path: str = QK_NORMS) -> FieldRule:
    """Every built attention layer holds a q norm and a k norm, read from the modules rather than the `qk_layernorm`
    flag: a bridge's own layer spec may build the norms with the flag off (MiniMax-M2 in bridge 0.4.x,
    minimax_m2_bridge.py:150-152; Gemma 3's spec in 0.4.x). The weight oracles prove what the norms hold. `path`: the
    q norms' model path (a vision-language wrapper's language model: `model.language_model.decoder...`)."""

    def held(value: Any, m: MegatronGet) -> bool:
        k_norms = m(path.replace("q_layernorm", "k_layernorm"))
        return bool(value) and all(norm is not None for norm in (*value, *k_norms))

    return FieldRule(megatron=path, expect=lambda _c, _m: True, observe=held, note=note)


def unsupported(what: str) -> str:
    """The expected value of a field whose HF setting Megatron cannot represent (never equals a Megatron value)."""
    return f"<not representable: {what}>"


def function_name(value: Any, _m: MegatronGet) -> str:
    """A Megatron function-valued field (activation) observed by its name."""
    return getattr(value, "__name__", repr(value))


def padded_vocab(c: HfView, m: MegatronGet) -> int:
    """Embedding / output rows Megatron must build: the HF vocab, padded to a multiple only when it pads."""
    vocab = c["vocab_size"]
    if not m("should_pad_vocab"):
        return vocab
    multiple = m("make_vocab_size_divisible_by") * m("tensor_model_parallel_size")
    return -(-vocab // multiple) * multiple


HEADS_AND_VOCAB = (
    same("num_attention_heads", "num_attention_heads"),
    same("num_key_value_heads", "num_query_groups", note="GQA groups"),
    FieldRule(megatron="kv_channels", hf=("head_dim",), expect=lambda c, _m: Geometry.from_hf_config(c).head_dim),
    same("vocab_size", "vocab_size"),
    FieldRule(
        megatron="model.vocab_size",
        hf=("vocab_size",),
        expect=padded_vocab,
        note="embedding / output rows: the HF vocab, padded only when should_pad_vocab",
    ),
)
"""Attention heads, KV groups, head_dim and vocabulary (with padding): the same rule for every architecture."""

IGNORED: dict[str, str] = {
    "_name_or_path": "where the config was read from",
    "architectures": "selects the bridge class (the bridge registry checks it)",
    "model_type": "selects this table",
    "transformers_version": "writer metadata",
    "dtype": "storage dtype of the weights (the roundtrip oracle compares dtypes bitwise)",
    "torch_dtype": "storage dtype of the weights (the roundtrip oracle compares dtypes bitwise)",
    "use_cache": "HF generation KV cache switch",
    "cache_implementation": "HF generation KV cache kind (Gemma's hybrid: sliding and full layers' caches)",
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
    "mamba_ssm_dtype": "not read by transformers' Qwen3.5 (published for serving engines' GDN state cache dtype)",
}
"""HF fields that do not describe the computed function, with the reason; every other field needs a rule."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Coverage:
    """What a table covers: rules plus ignored fields (a field is covered if it or its parent is named)."""

    rules: tuple[FieldRule, ...]
    ignored: dict[str, str] = field(default_factory=lambda: dict(IGNORED))

    def covers(self, hf_field: str) -> bool:
        """True when a rule or the ignore list names `hf_field` or the dict it sits in."""
        named = {f for r in self.rules for f in (*r.hf, *r.also)} | set(self.ignored)
        return hf_field in named or hf_field.split(".", 1)[0] in named
