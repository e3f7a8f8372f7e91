"""The config oracle's tables for Qwen3-VL (qwen3_vl) and Qwen3-VL-MoE (qwen3_vl_moe), as megatron-bridge 0.6.2
builds them (qwen_vl/qwen3_vl_bridge.py:63-112, :208-272; the vision tower's config at
qwen_vl/modelling_qwen3_vl/transformer_config.py:63-130).

The language model's fields sit under `text_config`, the vision tower's under `vision_config`; the Qwen3 / Qwen3-MoE
rules of dense.py and qwen3_moe.py are read there. Megatron's language fields are the model's own config; the vision
tower's are `model.vision_model.config.*` (the stage that holds the tower).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from convcheck.models.config_rules import FieldRule, HfView, MegatronGet, function_name, implied, same, unsupported
from convcheck.models.dense import NORM_ROPE_ACT, SHAPES
from convcheck.models.qwen3_moe import QWEN3_MOE_TABLE

TEXT, VISION = "text_config", "vision_config"


class Nested(Mapping[str, Any]):
    """The config oracle's view `c` seen from inside one sub-config: `n["x"]` is `c["text_config.x"]`, `n["a.b"]`
    is `c["text_config.a"]["b"]` (the view flattens one level only)."""

    def __init__(self, view: HfView, prefix: str) -> None:
        self._view, self._prefix = view, prefix

    def __getitem__(self, key: str) -> Any:
        flat = f"{self._prefix}.{key}"
        if flat in self._view:
            return self._view[flat]
        head, dot, tail = key.partition(".")
        parent = self._view.get(f"{self._prefix}.{head}")
        if dot and isinstance(parent, Mapping) and tail in parent:
            return parent[tail]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        start = f"{self._prefix}."
        return (key[len(start) :] for key in self._view if key.startswith(start))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def in_text(rule: FieldRule) -> FieldRule:
    """`rule` (a decoder's, over top-level fields) read from `text_config`; a `model.X` field is the language
    model's (`model.language_model.X`)."""
    expect = rule.expect
    megatron = (
        rule.megatron.replace("model.", "model.language_model.", 1)
        if rule.megatron.startswith("model.")
        else (rule.megatron)
    )
    return FieldRule(
        megatron=megatron,
        hf=tuple(f"{TEXT}.{name}" for name in rule.hf),
        also=tuple(f"{TEXT}.{name}" for name in rule.also),
        expect=lambda c, m: expect(Nested(c, TEXT), m),
        observe=rule.observe,
        note=rule.note,
        missing=rule.missing,
    )


def _mrope(c: HfView, _m: MegatronGet) -> Any:
    """("mrope", rope_theta, mrope_section): Qwen3-VL's interleaved multimodal RoPE (HF applies it interleaved
    whatever mrope_interleaved says, modeling_qwen3_vl.py:368); other rope types are not representable."""
    rope = c.get(f"{TEXT}.rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        return unsupported(f"rope_type {rope.get('rope_type')!r} with mrope")
    return ("mrope", float(rope.get("rope_theta", 10000.0)), list(rope.get("mrope_section", [24, 20, 20])))


def _mrope_observed(value: Any, m: MegatronGet) -> Any:
    return (value, float(m("rotary_base")), list(m("mrope_section")))


REPLACED = {"rope_parameters.rope_theta", "position_embedding_type", "share_embeddings_and_output_weights"}
"""NORM_ROPE_ACT rules the VL table replaces: mrope, and tied embeddings read from the top level."""

LANGUAGE = (
    *(in_text(rule) for rule in SHAPES),
    *(in_text(rule) for rule in NORM_ROPE_ACT if rule.megatron not in REPLACED and "rope_theta" not in rule.hf[:1]),
    FieldRule(
        megatron="position_embedding_type",
        hf=(f"{TEXT}.rope_parameters",),
        expect=_mrope,
        observe=_mrope_observed,
        note="with rotary_base and mrope_section (the t / h / w split of the rotary half)",
    ),
    same(
        "tie_word_embeddings",
        "share_embeddings_and_output_weights",
        note="the top-level flag (text_config's own is not read)",
    ),  # fmt: skip
    in_text(same("attention_bias", "add_qkv_bias")),
    implied("add_bias_linear", False, "Qwen3-VL o_proj and MLP have no bias"),
    implied("qk_layernorm", True, "Qwen3-VL attention always applies q_norm / k_norm"),
)


def _vision(hf: str, megatron: str, note: str = "") -> FieldRule:
    """vision_config.<hf> equals the vision tower's TransformerConfig field."""
    name = f"{VISION}.{hf}"
    return FieldRule(megatron=f"model.vision_model.config.{megatron}", hf=(name,), expect=lambda c, _m: c[name],
                     note=note)  # fmt: skip


VISION_TOWER = (
    _vision("depth", "num_layers"),
    _vision("hidden_size", "hidden_size"),
    _vision("num_heads", "num_attention_heads"),
    _vision("intermediate_size", "ffn_hidden_size"),
    _vision("patch_size", "patch_size"),
    _vision("temporal_patch_size", "temporal_patch_size"),
    _vision("in_channels", "in_channels"),
    _vision("spatial_merge_size", "spatial_merge_size"),
    _vision("num_position_embeddings", "num_position_embeddings"),
    _vision("deepstack_visual_indexes", "deepstack_visual_indexes", "which blocks' outputs feed deepstack mergers"),
    FieldRule(
        megatron="model.vision_model.config.activation_func",
        hf=(f"{VISION}.hidden_act",),
        expect=lambda c, _m: {"gelu_pytorch_tanh": "gelu"}.get(
            c[f"{VISION}.hidden_act"],
            unsupported(f"vision hidden_act {c[f'{VISION}.hidden_act']!r} (the bridge fixes tanh-approximated GELU)"),
        ),
        observe=lambda value, m: function_name(getattr(value, "func", value), m),
        note="the bridge fixes partial(F.gelu, approximate='tanh') whatever hidden_act says",
    ),
    FieldRule(
        megatron="model.language_model.config.hidden_size",
        hf=(f"{VISION}.out_hidden_size",),
        expect=lambda c, _m: c[f"{VISION}.out_hidden_size"],
        note="the mergers' output feeds the language model's embeddings",
    ),
)
"""The vision tower's shapes; its LayerNorm eps 1e-6, biases and absence of GQA are fixed on both sides."""

TOKENS = (
    FieldRule(
        megatron="model.image_token_id",
        hf=("image_token_id",),
        expect=lambda c, _m: c["image_token_id"],
        note="which input ids the vision embeddings replace",
    ),
    FieldRule(megatron="model.video_token_id", hf=("video_token_id",), expect=lambda c, _m: c["video_token_id"]),
)
IGNORED_HERE = (
    "vision_start_token_id",
    "vision_end_token_id",
    *(f"{sub}.{name}" for sub in (TEXT, VISION) for name in ("initializer_range", "dtype")),
    *(f"{TEXT}.{name}" for name in ("bos_token_id", "eos_token_id", "pad_token_id", "use_cache")),
)
"""Fields that do not change the computed function: the vision start / end ids (HF's rope index finds images by
image_token_id), the sub-configs' init range and storage dtype (the roundtrip oracle compares dtypes bitwise) and
generation metadata."""


def _ignored(names: tuple[str, ...]) -> tuple[FieldRule, ...]:
    """IGNORED_HERE's fields covered by rules that always hold (the config oracle's own ignore list names top-level
    fields only)."""
    return tuple(FieldRule(megatron="num_layers", hf=(name,), expect=lambda _c, _m: "not read",
                           observe=lambda _v, _m: "not read", note="does not change the forward")
                 for name in names)  # fmt: skip


QWEN3_VL_TABLE = (*LANGUAGE, implied("num_moe_experts", None, "dense language model"), *VISION_TOWER, *TOKENS,
                  *_ignored(IGNORED_HERE))  # fmt: skip
"""model_type qwen3_vl: Qwen3's rules under text_config, mrope, the vision tower under vision_config."""

MOE_ONLY = tuple(
    in_text(rule)
    for rule in QWEN3_MOE_TABLE
    if rule.megatron
    in (
        "num_moe_experts",
        "moe_router_topk",
        "moe_ffn_hidden_size",
        "moe_router_pre_softmax",
        "moe_layer_freq",
        "moe_aux_loss_coeff",
        "moe_router_score_function",
        "moe_router_topk_scaling_factor",
        "moe_router_enable_expert_bias",
        "moe_shared_expert_intermediate_size",
    )
    and rule.megatron != "moe_router_pre_softmax"
)
QWEN3_VL_MOE_TABLE = (
    *LANGUAGE,
    *MOE_ONLY,
    implied(
        "moe_router_pre_softmax",
        False,
        "Qwen3-VL-MoE's router always renormalises the top-k (modeling_qwen3_vl_moe.py Qwen3VLMoeTextTopKRouter)",
    ),
    *VISION_TOWER,
    *TOKENS,
    *_ignored(IGNORED_HERE),
)
"""model_type qwen3_vl_moe: the Qwen3-VL table with Qwen3-MoE's expert rules under text_config (no norm_topk_prob:
Qwen3-VL-MoE always renormalises)."""
