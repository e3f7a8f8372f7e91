"""Which HF tensors a vLLM parameter packs, and where an element of it comes from (pure Python, no torch).

vLLM stacks q/k/v into `qkv_proj` (rows q, k, v), gate/up into `gate_up_proj` (rows gate, up), MLA's q_a_proj and
kv_a_proj_with_mqa into `fused_qkv_a_proj` (rows q_a, kv_a), the routed experts into `w13_weight` [E, 2I, H] (each
expert's gate rows, then up rows; GPT-OSS: its fused `gate_up_proj` [E, H, 2I] transposed) and `w2_weight` [E, H, I]
(down), and splits MLA's kv_b_proj [heads * (nope + v), kv_lora] into `W_UK_T` [heads, nope, kv_lora] and `W_UV`
[heads, kv_lora, v]; some families rename (GPT-OSS `attn.` / `embedding`, NemotronH `backbone.` -> `model.`, Mamba's
`A_log` -> `A`); the embedding and lm_head are padded to a multiple of the engine's vocabulary padding. Names are the
engine's state keys (`params.NAME` for a parameter, `packed.MODULE.weight` for a weight as the CPU backend last packed
it); `hf` maps every HF tensor name of the checkpoint to its shape.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from convcheck.hf.geometry import Geometry

Shapes = Mapping[str, Sequence[int]]
"""HF tensor name -> shape, for every tensor of the checkpoint."""

_EXPERTS = re.compile(r"^(?P<prefix>.*\.mlp)\.experts(?:\.routed_experts)?\.(?P<which>w13|w2)_(?P<what>weight|bias)$")

_RENAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^model\.embedding\."), "model.embed_tokens."),  # GPT-OSS
    (re.compile(r"^(model\.layers\.\d+)\.attn\."), r"\1.self_attn."),  # GPT-OSS
    (re.compile(r"^model\.embed_tokens\."), "backbone.embeddings."),  # NemotronH
    (re.compile(r"^model\."), "backbone."),  # NemotronH
    (re.compile(r"\.mixer\.A$"), ".mixer.A_log"),  # Mamba: the engine holds A = -exp(A_log)
)
"""Engine-name rewrites tried in order, each on the result of the last, until a name of the checkpoint comes out."""

_STACKED: tuple[tuple[str, tuple[str, ...]], ...] = (
    (".qkv_proj.", ("q_proj", "k_proj", "v_proj")),
    (".gate_up_proj.", ("gate_proj", "up_proj")),
    (".fused_qkv_a_proj.", ("q_a_proj", "kv_a_proj_with_mqa")),
)
"""Engine tensors that stack HF tensors along their rows, in this order."""

_MLA_SPLIT = re.compile(r"^(?P<attn>.*\.self_attn)\.mla_attn(?:\.mla_attn)?\.(?P<which>W_UK_T|W_UV)$")


def engine_name(key: str) -> str:
    """`params.model.x.weight` / `packed.model.x.weight` -> `model.x.weight`."""
    return key.split(".", 1)[1] if key.startswith(("params.", "packed.")) else key


def hf_name(name: str, hf: Shapes) -> str | None:
    """The checkpoint's name for engine tensor `name` (itself, or after the family's renames), or None."""
    if name in hf:
        return name
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
        if name in hf:
            return name
    return None


def sources(key: str, geometry: Geometry, hf: Shapes) -> list[str]:
    """The HF tensors packed into engine tensor `key` (those of the checkpoint; at least one name)."""
    name = engine_name(key)
    experts = _EXPERTS.match(name)
    if experts:
        return _expert_sources(experts, geometry, hf) or [name]
    split = _MLA_SPLIT.match(name)
    if split:
        kv_b = hf_name(f"{split['attn']}.kv_b_proj.weight", hf)
        return [kv_b] if kv_b else [name]
    for stacked, parts in _STACKED:
        if stacked in name:
            found = [hf_name(name.replace(stacked, f".{p}."), hf) for p in parts]
            return [n for n in found if n] or [name]
    return [hf_name(name, hf) or name]


def _expert_sources(match: re.Match[str], geometry: Geometry, hf: Shapes) -> list[str]:
    prefix, which, what = match["prefix"], match["which"], match["what"]
    parts = ("gate_proj", "up_proj") if which == "w13" else ("down_proj",)
    found = [f"{prefix}.experts.{e}.{p}.{what}" for e in range(geometry.num_experts) for p in parts]
    fused = f"{prefix}.experts.{'gate_up_proj' if which == 'w13' else 'down_proj'}" + (
        "_bias" if what == "bias" else ""
    )
    return [n for n in found if n in hf] or [n for n in (fused,) if n in hf]


def locate(key: str, index: Sequence[int], geometry: Geometry, hf: Shapes) -> str:
    """` <- HF_NAME[i, j]` for the element at `index` of engine tensor `key` in its unpacked layout, or a note where
    the element is padding; "" where the element is the HF tensor's own."""
    name = engine_name(key)
    rows = list(index)
    if not rows:
        return ""
    for stacked, parts in _STACKED:
        if stacked in name:
            return _stacked_row(name, stacked, parts, rows, hf)
    experts = _EXPERTS.match(name)
    if experts and experts["what"] == "weight" and len(rows) == 3:
        expert, row, col = rows
        fused = _expert_sources(experts, geometry, hf)
        if fused and ".experts.gate_up_proj" in fused[0] or fused and fused[0].endswith(".experts.down_proj"):
            return _at(fused[0], [expert, col, row], hf)  # GPT-OSS: [E, H, 2I] / [E, I, H], the engine's transposed
        width = geometry.moe_ffn or geometry.ffn
        part, row = ("down_proj", row) if experts["which"] == "w2" else (
            ("gate_proj", row) if row < width else ("up_proj", row - width))  # fmt: skip
        return _at(f"{experts['prefix']}.experts.{expert}.{part}.weight", [row, col], hf)
    split = _MLA_SPLIT.match(name)
    if split and len(rows) == 3:
        nope, v = geometry.qk_nope_head_dim, geometry.v_head_dim
        head, a, b = rows
        row, col = (head * (nope + v) + a, b) if split["which"] == "W_UK_T" else (head * (nope + v) + nope + b, a)
        return _at(f"{split['attn']}.kv_b_proj.weight", [row, col], hf)
    if name.endswith(("embed_tokens.weight", "lm_head.weight", "embedding.weight")) and rows[0] >= geometry.vocab > 0:
        return f" (a padding row past the vocabulary of {geometry.vocab})"
    own = hf_name(name, hf)
    if own is None or (own == name and len(hf[own]) == len(rows)):
        return ""
    return _at(own, _unsqueezed(rows, hf[own]), hf)


def _unsqueezed(rows: list[int], shape: Sequence[int]) -> list[int]:
    """`rows` of an engine tensor that drops the HF tensor's size-1 dimensions (Mamba's conv1d [C, 1, K] -> [C, K]),
    as an index of the HF tensor."""
    if len(shape) <= len(rows):
        return rows
    out, given, extra = [], iter(rows), len(shape) - len(rows)
    for size in shape:
        if size == 1 and extra > 0:
            out.append(0)
            extra -= 1
        else:
            out.append(next(given, 0))
    return out


def _stacked_row(name: str, stacked: str, parts: Sequence[str], rows: list[int], hf: Shapes) -> str:
    """The part of a row-stacked engine tensor that row rows[0] falls in, by the parts' own row counts."""
    row = rows[0]
    for part in parts:
        source = hf_name(name.replace(stacked, f".{part}."), hf) or name.replace(stacked, f".{part}.")
        height = hf[source][0] if source in hf else 0
        if row < height:
            return _at(source, [row, *rows[1:]], hf)
        row -= height
    return f" (row {rows[0]} is past the {', '.join(parts)} rows the checkpoint holds)"


def _at(hf_tensor: str, index: list[int], hf: Shapes) -> str:
    return f" <- {hf_tensor}{index}" if hf_tensor in hf else f" <- {hf_tensor}{index} (not in the checkpoint)"
