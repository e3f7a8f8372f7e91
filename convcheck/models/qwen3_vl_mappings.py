"""Qwen3-VL's and Qwen3-VL-MoE's explicit mappings: the Qwen3 / Qwen3-MoE decoder of `dense.py` under
`language_model.` (HF `model.language_model.`), the vision tower under `vision_model.` (HF `model.visual.`).

Vision side, per block N (HF `model.visual.blocks.N.`, Megatron `vision_model.decoder.layers.N.`), with hidden V, H
heads of d channels and MLP width I:
- `attn.qkv` `[3 * H * d, V]` (+ bias `[3 * H * d]`) <-> `self_attention.linear_qkv` `[H * 3 * d / tp, V]`: per-head
  interleaved, whole heads per TP rank (convcheck.mappings.vision.ConcatenatedQKV);
- `attn.proj` `[V, H * d]` <-> `linear_proj.weight`, row-parallel (split on dim 1), its bias `[V]` whole on every rank;
- `mlp.linear_fc1` `[I, V]` (+ bias `[I]`) column-parallel (dim 0), `mlp.linear_fc2` `[V, I]` row-parallel (dim 1),
  its bias whole;
- `norm1` / `norm2` LayerNorm weight and bias `[V]` <-> the fused `layer_norm_weight` / `layer_norm_bias` of
  linear_qkv / linear_fc1, whole.
Patch embedding: the Conv3d weight `[V, C, T, P, P]` and bias `[V]` whole on every rank (a conv is not split), as is
the learned position embedding `[N_pos, V]`. The patch merger (`merger.`) and each deepstack merger
(`deepstack_merger_list.K.`): `norm` (`patch_norm`: `[V]` for the merger, `[4V]` for deepstack ones, whole),
`linear_fc1` `[4V, 4V]` (+ bias) column-parallel, `linear_fc2` `[D, 4V]` row-parallel with its bias `[D]` whole
(D: the language model's hidden size).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from typing import Any

from convcheck.hf.geometry import Geometry
from convcheck.mappings import ConcatenatedQKV, Gated, Replicated, Split
from convcheck.mappings.fused_experts import FusedSlice, TransposedFusedSlice
from convcheck.mappings.registry import MappingRule
from convcheck.models.dense_mappings import (
    ATTENTION,
    EMBEDDING_AND_FINAL_NORM,
    EXPERTS,
    GATED_MLP,
    LAYER_NORMS,
    output_layer,
)
from convcheck.models.shared_mappings import LAYER_PREFIX, expert_id, expert_weight

LM, HF_LM = "language_model.", "model.language_model."
VISION, HF_VISION = r"vision_model\.", "model.visual."
BLOCK = VISION + r"decoder\.layers\.(?P<block>\d+)\."
MERGER = VISION + r"(?P<merger>merger|decoder\.deepstack_merger_list\.(?P<index>\d+))\."


def language_model_name(hf: str) -> str:
    """A decoder HF name as the VL checkpoint spells it: `model.X` -> `model.language_model.X` (`lm_head` stays)."""
    return HF_LM + hf[len("model.") :] if hf.startswith("model.") else hf


def _renamed(mapping: Any, megatron: str, rename: Callable[[str], str] = language_model_name) -> Any:
    """`mapping` with its Megatron name `megatron` and every HF name in the VL spelling `rename` gives (nested
    mappings and tuples of names, as a GDN in_proj's four sources, too)."""
    changes: dict[str, Any] = {}
    for field in fields(mapping):
        value = getattr(mapping, field.name)
        if field.name == "megatron":
            changes["megatron"] = megatron
        elif isinstance(value, str):
            changes[field.name] = rename(value)
        elif isinstance(value, tuple) and value and all(isinstance(item, str) for item in value):
            changes[field.name] = tuple(rename(item) for item in value)
        elif is_dataclass(value):
            changes[field.name] = _renamed(value, megatron, rename)
    return replace(mapping, **changes)


def text_model_name(hf: str) -> str:
    """The inverse of `language_model_name`: `model.language_model.X` -> `model.X` (other names unchanged)."""
    return "model." + hf[len(HF_LM) :] if hf.startswith(HF_LM) else hf


def under_language_model(
    rule: MappingRule,
    rename: Callable[[str], str] = language_model_name,
    inverse: Callable[[str], str] = text_model_name,
) -> MappingRule:
    """A decoder rule for the same parameter under `language_model.` (HF names as `rename` spells them: by default
    `model.language_model.`); a rule that applies only to some checkpoint spellings (its `when`: fused experts) asks
    the checkpoint's names as the text model spells them (`inverse`)."""
    inner = re.compile(rule.pattern)

    def own(match: re.Match[str]) -> re.Match[str]:
        found = inner.fullmatch(match[0][len(LM) :])
        assert found is not None  # the outer pattern is the inner one behind a literal prefix
        return found

    def build(match: re.Match[str], geometry: Geometry) -> Any:
        return _renamed(rule.build(own(match), geometry), match[0], rename)

    when = rule.when
    if when is None:
        return MappingRule(re.escape(LM) + rule.pattern, build)
    return MappingRule(re.escape(LM) + rule.pattern, build,
                       lambda match, names: when(own(match), frozenset(map(inverse, names))))  # fmt: skip


def _hf_block(match: re.Match[str], suffix: str) -> str:
    return f"{HF_VISION}blocks.{match['block']}.{suffix}"


def _hf_merger(match: re.Match[str], suffix: str) -> str:
    where = "merger" if match["merger"] == "merger" else f"deepstack_merger_list.{match['index']}"
    return f"{HF_VISION}{where}.{suffix}"


def vision_qkv(match: re.Match[str], geometry: Geometry) -> ConcatenatedQKV:
    """Block N's linear_qkv `[H * 3 * d / tp, V]` (or bias) <-> `blocks.N.attn.qkv` `[3 * H * d, V]`."""
    return ConcatenatedQKV(megatron=match[0], hf=_hf_block(match, f"attn.qkv.{match['kind']}"),
                           num_heads=geometry.vision_heads, head_dim=geometry.vision_head_dim)  # fmt: skip


def patch_embedding(match: re.Match[str], geometry: Geometry) -> Replicated:
    """The Conv3d patch embedding `[V, C, T, P, P]` (bias `[V]`) and position embedding `[N_pos, V]`: whole."""
    return Replicated(megatron=match[0], hf=f"{HF_VISION}{match['name']}")


def merger_linear(match: re.Match[str], geometry: Geometry) -> Split | Replicated:
    """A (deepstack) merger's linear_fc1 `[4V, 4V]` + bias (column-parallel), linear_fc2 `[D, 4V]` (row-parallel),
    linear_fc2's bias `[D]` (whole)."""
    hf = _hf_merger(match, f"linear_fc{match['fc']}.{match['kind']}")
    if match["fc"] == "2" and match["kind"] == "bias":
        return Replicated(megatron=match[0], hf=hf)
    return Split(megatron=match[0], hf=hf, dim=0 if match["fc"] == "1" else 1)


def block_linear(match: re.Match[str], geometry: Geometry) -> Split | Replicated:
    """Block N's attn.proj `[V, H * d]` (row-parallel, bias whole), mlp.linear_fc1 `[I, V]` + bias (column-parallel),
    mlp.linear_fc2 `[V, I]` (row-parallel, bias whole)."""
    hf = {"self_attention.linear_proj": "attn.proj", "mlp.linear_fc1": "mlp.linear_fc1",
          "mlp.linear_fc2": "mlp.linear_fc2"}[match["module"]]  # fmt: skip
    column = match["module"] == "mlp.linear_fc1"
    if match["kind"] == "bias" and not column:
        return Replicated(megatron=match[0], hf=_hf_block(match, f"{hf}.bias"))
    return Split(megatron=match[0], hf=_hf_block(match, f"{hf}.{match['kind']}"), dim=0 if column else 1)


def block_norm(match: re.Match[str], geometry: Geometry) -> Replicated:
    """norm1 / norm2 weight or bias `[V]`, fused into linear_qkv / linear_fc1, whole on every rank."""
    norm = "norm1" if match["module"] == "self_attention.linear_qkv" else "norm2"
    return Replicated(megatron=match[0], hf=_hf_block(match, f"{norm}.{match['kind']}"))


def merger_norm(match: re.Match[str], geometry: Geometry) -> Replicated:
    """A (deepstack) merger's patch_norm weight or bias (`[V]` for the merger, `[4V]` for a deepstack one)."""
    return Replicated(megatron=match[0], hf=_hf_merger(match, f"norm.{match['kind']}"))


KIND = r"(?P<kind>weight|bias)"
VISION_RULES = (
    MappingRule(VISION + r"(?P<name>patch_embed\.proj\.(weight|bias)|pos_embed\.weight)", patch_embedding),
    MappingRule(BLOCK + r"self_attention\.linear_qkv\." + KIND, vision_qkv),
    MappingRule(BLOCK + r"(?P<module>self_attention\.linear_qkv|mlp\.linear_fc1)\.layer_norm_" + KIND, block_norm),
    MappingRule(BLOCK + r"(?P<module>self_attention\.linear_proj|mlp\.linear_fc[12])\." + KIND, block_linear),
    MappingRule(MERGER + r"patch_norm\." + KIND, merger_norm),
    MappingRule(MERGER + r"linear_fc(?P<fc>[12])\." + KIND, merger_linear),
)
"""Every Megatron parameter of the Qwen3-VL vision tower (blocks, patch embedding, merger, deepstack mergers)."""


def _fused(match: re.Match[str], projection: str) -> str:
    return f"{HF_LM}layers.{match['layer']}.mlp.experts.{projection}"


def stored(inner: Gated | Split, name: str, geometry: Geometry) -> FusedSlice:
    """Expert slices as the checkpoint holds them: transposed, as published Qwen3-VL-MoE checkpoints do, or in
    nn.Linear's orientation where the checkpoint has them so (`Geometry.fused_experts_as_linear`: transformers 5's
    save_pretrained writes them that way, and reads either by shape)."""
    if geometry.fused_experts_as_linear:
        return FusedSlice(inner=inner, fused=name)
    return TransposedFusedSlice(inner=inner, fused=name)


def expert_fc1(match: re.Match[str], geometry: Geometry) -> FusedSlice:
    """Expert e's linear_fc1 `[2F / etp, V]` ([gate; up] rows) <-> `experts.gate_up_proj[e]`, stored `[V, 2F]` (or
    `[2F, V]`: `stored`)."""
    name, e = _fused(match, "gate_up_proj"), expert_id(match)
    inner = Gated(megatron=match[0], axis="etp", expert=int(e), num_experts=geometry.num_experts,
                  gate=f"{name}[{e}].gate", up=f"{name}[{e}].up")  # fmt: skip
    return stored(inner, name, geometry)


def expert_fc2(match: re.Match[str], geometry: Geometry) -> FusedSlice:
    """Expert e's linear_fc2 `[V, F / etp]` <-> `experts.down_proj[e]`, stored `[F, V]` (or `[V, F]`: `stored`)."""
    name, e = _fused(match, "down_proj"), expert_id(match)
    inner = Split(megatron=match[0], axis="etp", dim=1, expert=int(e), num_experts=geometry.num_experts,
                  hf=f"{name}[{e}]")  # fmt: skip
    return stored(inner, name, geometry)


EXPERT_RULES = (
    MappingRule(re.escape(LM) + LAYER_PREFIX + expert_weight(1), expert_fc1),
    MappingRule(re.escape(LM) + LAYER_PREFIX + expert_weight(2), expert_fc2),
)
"""Routed experts (SequentialMLP or TE grouped) <-> their transposed slices of the layer's fused tensors."""


def qwen3_vl_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of Qwen3-VL: the Qwen3 decoder under language_model and the vision tower."""
    decoder = [*EMBEDDING_AND_FINAL_NORM, *LAYER_NORMS, *ATTENTION, *GATED_MLP, output_layer(tied)]
    return [*(under_language_model(rule) for rule in decoder), *VISION_RULES]


def qwen3_vl_moe_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of Qwen3-VL-MoE: router and fused routed experts in every layer, no dense MLP."""
    router = EXPERTS[0]
    decoder = [*EMBEDDING_AND_FINAL_NORM, *LAYER_NORMS, *ATTENTION, router, output_layer(tied)]
    return [*(under_language_model(rule) for rule in decoder), *EXPERT_RULES, *VISION_RULES]
