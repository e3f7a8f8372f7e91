"""The config oracle's tables for Qwen3.5-VL (qwen3_5) and Qwen3.5-VL-MoE (qwen3_5_moe), as megatron-bridge 0.6.2
builds them (qwen_vl/qwen35_vl_bridge.py:174-215, :278-312: the Qwen3.5 provider settings of qwen/qwen35_bridge.py
read from text_config, mrope, the tied flag from the top level; the vision tower's config at
qwen_vl/modelling_qwen3_vl/transformer_config.py:63-130).

The language model's rules are the Qwen3.5 / Qwen3.5-MoE tables of qwen_next_config.py read under `text_config`
(their plain-RoPE and tied-embedding rules replaced), the vision tower's Qwen3-VL's without deepstack (Qwen3.5 has no
deepstack mergers: Qwen3_5VisionConfig declares no deepstack_visual_indexes and the bridge reads an empty list).
"""

from __future__ import annotations

from typing import Any

from convcheck.models.config_rules import FieldRule, HfView, MegatronGet, implied, same, unsupported
from convcheck.models.qwen3_vl_config import IGNORED_HERE, TEXT, TOKENS, VISION_TOWER, _ignored, in_text
from convcheck.models.qwen_next_config import QWEN35_MOE_TABLE, QWEN35_TABLE

REPLACED = ("position_embedding_type", "rotary_base", "rotary_percent", "share_embeddings_and_output_weights")
"""Rules of the Qwen3.5 text tables the VL tables replace: the rope rules (the config oracle's view flattens one level,
so text_config.rope_parameters is one field: MROPE), and the tied flag read from the top level."""


def _mrope(c: HfView, _m: MegatronGet) -> Any:
    """("mrope", rope_theta, partial_rotary_factor, mrope_section): interleaved multimodal RoPE over the rotary share
    of head_dim (HF applies it interleaved whatever mrope_interleaved says, modeling_qwen3_5.py:162); other rope types
    are not representable."""
    rope = c.get(f"{TEXT}.rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        return unsupported(f"rope_type {rope.get('rope_type')!r} with mrope")
    share = rope.get("partial_rotary_factor", c.get(f"{TEXT}.partial_rotary_factor", 0.25))
    return (
        "mrope",
        float(rope.get("rope_theta", 10000.0)),
        float(share),
        list(rope.get("mrope_section", [11, 11, 10])),
    )


MROPE = FieldRule(
    megatron="position_embedding_type",
    hf=(f"{TEXT}.rope_parameters",),
    also=(f"{TEXT}.partial_rotary_factor",),
    expect=_mrope,
    observe=lambda value, m: (value, float(m("rotary_base")), float(m("rotary_percent")), list(m("mrope_section"))),
    note="with rotary_base, rotary_percent (the rotated share of head_dim) and mrope_section (the t / h / w split of "
    "the rotary half)",
)
TIED = same("tie_word_embeddings", "share_embeddings_and_output_weights",
            note="the top-level flag (text_config's own is not read)")  # fmt: skip
VISION = tuple(rule for rule in VISION_TOWER if not rule.megatron.endswith("deepstack_visual_indexes")) + (
    implied("model.vision_model.config.deepstack_visual_indexes", [], "Qwen3.5's vision tower has no deepstack"),
)


TEXT_IGNORED = ("tie_word_embeddings", "mamba_ssm_dtype")
"""text_config fields that do not change the VL model's forward: its own tie flag (transformers ties the wrapper's
lm_head by the top-level one, as the bridge reads it) and the serving engines' GDN state dtype published configs carry
(transformers does not read it)."""


def _vl_table(text: tuple[FieldRule, ...]) -> tuple[FieldRule, ...]:
    """`text` (a Qwen3.5 text table) under text_config, with mrope, the top-level tied flag, the vision tower, the
    image / video ids and the fields that do not change the forward (TEXT_IGNORED)."""
    language = tuple(in_text(rule) for rule in text if rule.megatron not in REPLACED)
    ignored = (*IGNORED_HERE, *(f"{TEXT}.{name}" for name in TEXT_IGNORED))
    return (*language, MROPE, TIED, *VISION, *TOKENS, *_ignored(ignored))


QWEN35_VL_TABLE = _vl_table(QWEN35_TABLE)
"""model_type qwen3_5: the Qwen3.5 table under text_config, mrope, the vision tower under vision_config."""
QWEN35_VL_MOE_TABLE = _vl_table(QWEN35_MOE_TABLE)
"""model_type qwen3_5_moe: the Qwen3.5-MoE table (routed and gated shared experts) in the same frame."""
