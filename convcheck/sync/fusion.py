"""Stacked-parameter names of an inference engine: which fused parameter and which part of it an HF tensor fills.

The pattern vLLM and SGLang load with: q/k/v into `qkv_proj` (shard ids "q", "k", "v", rows stacked in that
order), gate/up into `gate_up_proj` (shard ids 0, 1), and every MoE expert's gate/up/down into the expert stacks
`experts.w13_weight` [E, 2I, H] (w1 = gate rows, then w3 = up rows) and `experts.w2_weight` [E, H, I]. Squared-ReLU
MLPs (no gate, e.g. NemotronH) keep `up_proj` unfused and stack only the experts' up rows into w13. Gated attention
(Qwen3-Next, Qwen3.5: q_proj holds per head [q; gate]) makes the q part of qkv_proj twice as tall; Qwen3.5's separate
gated-DeltaNet projections stack as vLLM's Qwen3.5 loads them: in_proj_qkv then in_proj_z into `in_proj_qkvz`,
in_proj_b then in_proj_a into `in_proj_ba` (Qwen3-Next stores those two fused already).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<part>gate|up|down)_proj\.weight$")
_ATTENTION = re.compile(r"^(?P<prefix>.*)\.(?P<part>q|k|v)_proj\.(?P<kind>weight|bias)$")
_DENSE = re.compile(r"^(?P<prefix>.*)\.(?P<part>gate|up)_proj\.(?P<kind>weight|bias)$")
_GDN = re.compile(r"^(?P<prefix>.*)\.in_proj_(?P<part>qkv|z|b|a)\.weight$")
_GDN_PARAM = {"qkv": "in_proj_qkvz", "z": "in_proj_qkvz", "b": "in_proj_ba", "a": "in_proj_ba"}
_ORDER: dict[str | int, int] = {"q": 0, "k": 1, "v": 2, 0: 0, 1: 1, "w1": 0, "w3": 1, "w2": 0, "qkv": 0, "z": 1,
                                "b": 0, "a": 1}  # fmt: skip
GATED_ATTENTION = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
"""model_types whose q_proj holds the attention output gate (HF builds it without a config flag)."""
"""Row order of the parts inside one fused parameter (per expert for the stacks)."""


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if value is not None:
            return value
    return default


@dataclass(frozen=True, slots=True)
class Geometry:
    """What packing needs from the model config: q and k/v rows, the expert count, and whether MLPs are gated."""

    q_rows: int
    kv_rows: int
    experts: int
    gated: bool
    gdn_rows: tuple[int, int, int] = (0, 0, 0)
    """Gated DeltaNet: rows of in_proj_qkv, of in_proj_z and of each of in_proj_b / in_proj_a."""

    @classmethod
    def from_config(cls, config: Any) -> Geometry:
        """Read heads, KV heads, head_dim, experts and the MLP activation from a transformers config (or its dict); a
        vision-language config is read through its text_config (the language model is what the engine fuses)."""
        config = _get(config, "text_config", default=config)
        heads = int(_get(config, "num_attention_heads", default=1))
        kv = int(_get(config, "num_key_value_heads", default=heads))
        head_dim = int(_get(config, "head_dim", default=int(_get(config, "hidden_size", default=heads)) // heads))
        # n_routed_experts first: transformers 5.12.1's GlmMoeDsaConfig also holds an unread num_experts (256)
        experts = int(_get(config, "n_routed_experts", "num_experts", "num_local_experts", default=0))
        act = str(_get(config, "mlp_hidden_act", "hidden_act", default="silu"))
        gate = bool(_get(config, "attn_output_gate")) or _get(config, "model_type") in GATED_ATTENTION
        nk, nv = (
            int(_get(config, "linear_num_key_heads", default=0)),
            int(_get(config, "linear_num_value_heads", default=0)),
        )
        dk, dv = (
            int(_get(config, "linear_key_head_dim", default=0)),
            int(_get(config, "linear_value_head_dim", default=0)),
        )
        return cls(
            q_rows=heads * head_dim * (2 if gate else 1), kv_rows=kv * head_dim, experts=experts,
            gated=act != "relu2", gdn_rows=(2 * nk * dk + nv * dv, nv * dv, nv),
        )  # fmt: skip


def one_layout_gap(config: Any) -> str | None:
    """Why one q / k / v row layout cannot describe every layer of this model (None: it can). Gemma 4's full-attention
    layers have wider heads than its sliding ones (global_head_dim), may store no v_proj (attention_k_eq_v), and its
    last num_kv_shared_layers store no k_proj / v_proj; a vision-language config is read through its text_config."""
    text = _get(config, "text_config", default=config)
    head_dim, wide = _get(text, "head_dim"), _get(text, "global_head_dim")
    if wide and head_dim and int(wide) != int(head_dim):
        return f"its full-attention layers' heads are {int(wide)} wide, the other layers' {int(head_dim)}"
    if _get(text, "attention_k_eq_v"):
        return "its full-attention layers use their keys as values and store no v_proj"
    shared = int(_get(text, "num_kv_shared_layers", default=0) or 0)
    if shared:
        return f"its last {shared} layers reuse an earlier layer's keys and values and store no k_proj / v_proj"
    return None


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one HF tensor goes: the fused parameter, the engine's shard id, the expert (stacks) and the row range."""

    param: str
    shard: str | int
    expert: int | None
    row_start: int | None
    """First row of the part in the fused parameter (per expert for stacks); None: after the gate part."""


def slot_of(name: str, geometry: Geometry) -> Slot | None:
    """The fused slot of HF tensor `name`, or None when the engine keeps it as it is."""
    if m := _EXPERT.match(name):
        part, expert = m["part"], int(m["expert"])
        if part == "down":
            return Slot(f"{m['prefix']}.w2_weight", "w2", expert, 0)
        if part == "gate":
            return Slot(f"{m['prefix']}.w13_weight", "w1", expert, 0)
        return Slot(f"{m['prefix']}.w13_weight", "w3", expert, None if geometry.gated else 0)
    if m := _ATTENTION.match(name):
        start = {"q": 0, "k": geometry.q_rows, "v": geometry.q_rows + geometry.kv_rows}[m["part"]]
        return Slot(f"{m['prefix']}.qkv_proj.{m['kind']}", m["part"], None, start)
    if m := _GDN.match(name):
        part = m["part"]
        start = {"qkv": 0, "z": geometry.gdn_rows[0], "b": 0, "a": geometry.gdn_rows[2]}[part]
        return Slot(f"{m['prefix']}.{_GDN_PARAM[part]}.weight", part, None, start)
    if geometry.gated and (m := _DENSE.match(name)):
        return Slot(
            f"{m['prefix']}.gate_up_proj.{m['kind']}",
            0 if m["part"] == "gate" else 1,
            None,
            0 if m["part"] == "gate" else None,
        )
    return None


def sources_of(param: str, names: list[str], geometry: Geometry) -> list[str]:
    """The HF names among `names` that feed fused parameter `param` (just `param` when it is not fused)."""
    fed = [(slot, n) for n in names if (slot := slot_of(n, geometry)) is not None and slot.param == param]
    fed.sort(key=lambda pair: (pair[0].expert or 0, _ORDER[pair[0].shard]))
    return [n for _, n in fed] or [param]


def pack(tensors: dict[str, Any], geometry: Geometry) -> dict[str, Any]:
    """What an engine holds after loading every tensor of `tensors`: fused parameters stacked, the rest as they are."""
    out: dict[str, Any] = {}
    groups: dict[str, list[tuple[Slot, str]]] = {}
    for name, tensor in tensors.items():
        slot = slot_of(name, geometry)
        if slot is None:
            out[name] = tensor
        else:
            groups.setdefault(slot.param, []).append((slot, name))
    for param, members in groups.items():
        if members[0][0].expert is None:
            parts = sorted(members, key=lambda m: _ORDER[m[0].shard])
            out[param] = torch.cat([tensors[n] for _, n in parts], dim=0)
            continue
        per_expert: dict[int, list[tuple[Slot, str]]] = {}
        for slot, name in members:
            per_expert.setdefault(slot.expert, []).append((slot, name))  # type: ignore[arg-type]
        stacked = []
        for expert in sorted(per_expert):
            parts = sorted(per_expert[expert], key=lambda m: _ORDER[m[0].shard])
            stacked.append(torch.cat([tensors[n] for _, n in parts], dim=0))
        out[param] = torch.stack(stacked)
    return out


def locate(
    param: str, shape: tuple[int, ...], index: tuple[int, ...], geometry: Geometry
) -> tuple[str, tuple[int, ...]]:
    """The HF tensor and element that element `index` of parameter `param` (of `shape`) is packed from."""
    if param.endswith(".w2_weight"):
        expert, *rest = index
        return f"{param.removesuffix('.w2_weight')}.{expert}.down_proj.weight", tuple(rest)
    if param.endswith(".w13_weight"):
        expert, row, *rest = index
        half = shape[1] // 2 if geometry.gated else shape[1]
        part, row = ("gate", row) if geometry.gated and row < half else ("up", row - half if geometry.gated else row)
        return f"{param.removesuffix('.w13_weight')}.{expert}.{part}_proj.weight", (row, *rest)
    if m := re.match(r"^(?P<prefix>.*)\.qkv_proj\.(?P<kind>weight|bias)$", param):
        row, *rest = index
        k_start, v_start = geometry.q_rows, geometry.q_rows + geometry.kv_rows
        part, start = ("q", 0) if row < k_start else ("k", k_start) if row < v_start else ("v", v_start)
        return f"{m['prefix']}.{part}_proj.{m['kind']}", (row - start, *rest)
    if m := re.match(r"^(?P<prefix>.*)\.in_proj_(?P<fused>qkvz|ba)\.weight$", param):
        row, *rest = index
        first, cut = ("qkv", geometry.gdn_rows[0]) if m["fused"] == "qkvz" else ("b", geometry.gdn_rows[2])
        part, row = (first, row) if row < cut else ({"qkv": "z", "b": "a"}[first], row - cut)
        return f"{m['prefix']}.in_proj_{part}.weight", (row, *rest)
    if m := re.match(r"^(?P<prefix>.*)\.gate_up_proj\.(?P<kind>weight|bias)$", param):
        row, *rest = index
        half = shape[0] // 2
        part, row = ("gate", row) if row < half else ("up", row - half)
        return f"{m['prefix']}.{part}_proj.{m['kind']}", (row, *rest)
    return param, tuple(index)
