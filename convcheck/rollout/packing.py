"""Which HF tensors a vLLM parameter packs, and where an element of it comes from (pure Python, no torch).

vLLM stacks q/k/v into `qkv_proj` (rows q, k, v), gate/up into `gate_up_proj` (rows gate, up) and the routed
experts into `w13_weight` [E, 2I, H] (each expert's gate rows, then up rows) and `w2_weight` [E, H, I] (down); the
embedding and lm_head are padded to a multiple of the engine's vocabulary padding. Names are the engine's state keys
(`params.NAME` for a parameter, `packed.MODULE.weight` for a weight as the CPU backend last packed it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from convcheck.hf.geometry import Geometry

_EXPERTS = re.compile(r"^(?P<prefix>.*\.mlp)\.experts(?:\.routed_experts)?\.(?P<which>w13|w2)_weight$")


def engine_name(key: str) -> str:
    """`params.model.x.weight` / `packed.model.x.weight` -> `model.x.weight`."""
    return key.split(".", 1)[1] if key.startswith(("params.", "packed.")) else key


def sources(key: str, geometry: Geometry, hf_names: Sequence[str]) -> list[str]:
    """The HF tensors packed into engine tensor `key` (those of `hf_names` that exist; at least the name itself)."""
    name = engine_name(key)
    known = set(hf_names)
    experts = _EXPERTS.match(name)
    if experts:
        parts = ("gate_proj", "up_proj") if experts["which"] == "w13" else ("down_proj",)
        found = [f"{experts['prefix']}.experts.{e}.{p}.weight" for e in range(geometry.num_experts) for p in parts]
        fused = [f"{experts['prefix']}.experts.{'gate_up_proj' if experts['which'] == 'w13' else 'down_proj'}"]
        return [n for n in found if n in known] or [n for n in fused if n in known] or [name]
    for packed, parts in ((".qkv_proj.", ("q_proj", "k_proj", "v_proj")), (".gate_up_proj.", ("gate_proj", "up_proj"))):
        if packed in name:
            found = [name.replace(packed, f".{p}.") for p in parts]
            return [n for n in found if n in known] or [name]
    return [name]


def locate(key: str, index: Sequence[int], geometry: Geometry, hf_names: Sequence[str]) -> str:
    """` <- HF_NAME[i, j]` for the element at `index` of engine tensor `key` in its unpacked layout, or a note where
    the element is padding; "" where the element is the HF tensor's own."""
    name = engine_name(key)
    known = set(hf_names)
    rows = list(index)
    head_dim = geometry.head_dim
    if ".qkv_proj." in name and rows:
        q = geometry.num_heads * head_dim
        kv = geometry.num_query_groups * head_dim
        part, row = ("q_proj", rows[0]) if rows[0] < q else ("k_proj", rows[0] - q) if rows[0] < q + kv else (
            "v_proj", rows[0] - q - kv)  # fmt: skip
        return _at(name.replace(".qkv_proj.", f".{part}."), [row, *rows[1:]], known)
    if ".gate_up_proj." in name and rows:
        width = geometry.ffn
        part, row = ("gate_proj", rows[0]) if rows[0] < width else ("up_proj", rows[0] - width)
        return _at(name.replace(".gate_up_proj.", f".{part}."), [row, *rows[1:]], known)
    experts = _EXPERTS.match(name)
    if experts and len(rows) == 3:
        expert, row, col = rows
        width = geometry.moe_ffn or geometry.ffn
        if experts["which"] == "w13":
            part, row = ("gate_proj", row) if row < width else ("up_proj", row - width)
        else:
            part = "down_proj"
        return _at(f"{experts['prefix']}.experts.{expert}.{part}.weight", [row, col], known)
    if rows and name.endswith(("embed_tokens.weight", "lm_head.weight")) and rows[0] >= geometry.vocab > 0:
        return f" (a padding row past the vocabulary of {geometry.vocab})"
    return ""


def _at(hf_name: str, index: list[int], known: set[str]) -> str:
    return f" <- {hf_name}{index}" if hf_name in known else f" <- {hf_name}{index} (not in the checkpoint)"
