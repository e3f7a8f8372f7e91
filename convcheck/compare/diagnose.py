"""Mismatch diagnosis: name the rearrangement that turns a source tensor into a differing export.

Pure functions over tensors. Fixture values are distinct within a tensor, so every row (dim 0 slice) or
column (dim 1 slice) of the export can be traced back to the source row/column holding the same bytes:
transposes, block reorders along a dim (TP blocks, heads, query groups), rows taken from another tensor
(q/k or gate/up swaps, expert renumbering), and rows dropped or padded are named from that provenance.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from convcheck.compare.bits import int_view, together

Segment = tuple[int, int, str | None, int]
"""(actual start, actual stop, source tensor name or None when unmatched, source start)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Diagnosis:
    """The rearrangement that explains a difference (`kind` machine-readable, `text` one line)."""

    kind: str
    text: str


def _rows(tensor: Any, dim: int) -> list[bytes]:
    """Raw bytes of each slice of `tensor` along `dim` (a 1-D tensor gives one slice per element); any device."""
    t = tensor.detach().cpu()
    if t.dim() == 0:
        return [int_view(t).numpy().tobytes()]
    t = t.movedim(dim, 0).contiguous()
    flat = int_view(t).reshape(t.shape[0], -1)
    return [bytes(r) for r in flat.numpy().view("uint8").reshape(t.shape[0], -1)]


def _segments(actual: list[bytes], sources: dict[str, list[bytes]]) -> list[Segment]:
    """Provenance of each actual row as maximal runs of consecutive source rows of one tensor."""
    lookup: dict[bytes, tuple[str, int]] = {}
    for name, rows in reversed(list(sources.items())):  # the first source (the expected tensor) wins ties
        for j, row in enumerate(rows):
            lookup[row] = (name, j)
    segs: list[Segment] = []
    for i, row in enumerate(actual):
        src = lookup.get(row)
        name, j = src if src else (None, -1)
        if segs:
            a0, a1, n0, s0 = segs[-1]
            if n0 == name and (name is None or j == s0 + (a1 - a0)) and a1 == i:
                segs[-1] = (a0, i + 1, n0, s0)
                continue
        segs.append((i, i + 1, name, j))
    return segs


def _strip_digits(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def _describe_dim(segs: list[Segment], expected_name: str, n_expected: int, dim: int) -> Diagnosis | None:
    """Name the rearrangement along `dim` from the provenance segments, or None when nothing fits."""
    unit = "rows" if dim == 0 else "columns"
    n_actual = segs[-1][1] if segs else 0
    names = {s[2] for s in segs}
    if names == {expected_name}:
        return _own_rows(segs, n_actual, n_expected, dim, unit)
    if None in names:
        return _padded(segs, expected_name, n_actual, n_expected, dim, unit)
    whole = _whole_other_tensor(segs, names, expected_name, n_actual, n_expected)
    if whole is not None:
        return whole
    return _mixed_sources(segs, names, expected_name, unit)


def _own_rows(segs: list[Segment], n_actual: int, n_expected: int, dim: int, unit: str) -> Diagnosis | None:
    """Every row comes from the expected tensor: truncated, blocks swapped or reordered, or otherwise permuted."""
    if len(segs) == 1:
        a0, a1, _, s0 = segs[0]
        if n_actual < n_expected:
            return Diagnosis(
                kind="dropped",
                text=f"{n_expected - n_actual} {unit} dropped along dim {dim}: export holds source {unit} "
                f"{s0}:{s0 + a1 - a0} of {n_expected} (truncated, e.g. vocab padding removed wrongly)",
            )
        return None
    size = 0
    for a0, a1, _, s0 in segs:
        size = math.gcd(size, math.gcd(a1 - a0, math.gcd(a0, s0)))
    if n_actual == n_expected and size > 0 and n_expected % size == 0:
        moved = _block_moves(segs, size, dim, unit)
        if moved is not None:
            return moved
    pieces = ", ".join(f"{a0}:{a1}<-{s0}:{s0 + a1 - a0}" for a0, a1, _, s0 in segs[:8])
    return Diagnosis(kind="permuted", text=f"{unit} along dim {dim} permuted (actual<-source): {pieces}")


def _block_moves(segs: list[Segment], size: int, dim: int, unit: str) -> Diagnosis | None:
    """Blocks of `size` rows moved as wholes (at most 64 blocks): two swapped, or reordered; None otherwise."""
    perm = [s0 // size + k for a0, a1, _, s0 in segs for k in range((a1 - a0) // size)]
    if sorted(perm) != list(range(len(perm))) or len(perm) > 64:
        return None
    moved = [i for i, p in enumerate(perm) if p != i]
    if len(moved) == 2 and len(perm) > 2:
        i, j = moved
        return Diagnosis(
            kind="block-swap",
            text=f"blocks of {size} {unit} swapped along dim {dim}: {unit} {i * size}:{(i + 1) * size} "
            f"<-> {j * size}:{(j + 1) * size} (a head / query-group swap when {size} is a head or "
            "group size)",
        )
    return Diagnosis(
        kind="block-reorder",
        text=f"{len(perm)} blocks of {size} {unit} reordered along dim {dim}: source block order "
        f"{perm} (TP-size blocks out of order when {len(perm)} is the TP size: "
        "a shard concatenation order bug)",
    )


def _padded(
    segs: list[Segment], expected_name: str, n_actual: int, n_expected: int, dim: int, unit: str
) -> Diagnosis | None:
    """Some rows match no source: the whole expected tensor first, then padding rows; None otherwise."""
    matched = [s for s in segs if s[2] is not None]
    if matched and len(matched) == 1 and matched[0][2] == expected_name and matched[0][0] == 0:
        a0, a1, _, s0 = matched[0]
        if s0 == 0 and a1 == n_expected and n_actual > n_expected:
            return Diagnosis(
                kind="padded",
                text=f"{n_actual - n_expected} {unit} padded along dim {dim} after the {n_expected} source {unit}",
            )
    return None


def _whole_other_tensor(
    segs: list[Segment], names: set[str | None], expected_name: str, n_actual: int, n_expected: int
) -> Diagnosis | None:
    """The export is, in order and whole, one other source tensor (renumbered when only digits differ)."""
    if len(names) != 1 or len(segs) != 1 or n_actual != n_expected:
        return None
    (other,) = names
    if _strip_digits(other) == _strip_digits(expected_name):
        return Diagnosis(kind="renumbered", text=f"equals source tensor {other} (expert/layer id renumbering)")
    return Diagnosis(kind="other-tensor", text=f"equals source tensor {other}")


def _mixed_sources(segs: list[Segment], names: set[str | None], expected_name: str, unit: str) -> Diagnosis:
    """Rows taken from other source tensors, with the likely pair swap named (gate/up, q/k)."""
    pieces = ", ".join(
        f"{unit} {a0}:{a1} <- {'itself' if n == expected_name else n} {s0}:{s0 + a1 - a0}" for a0, a1, n, s0 in segs[:8]
    )
    others = sorted(n for n in names if n != expected_name)
    pair = " (gate/up halves swapped)" if any(_gate_up_pair(expected_name, o) for o in others) else ""
    if any(_qk_pair(expected_name, o) for o in others):
        pair = " (q/k swap)"
    return Diagnosis(kind="mixed-sources", text=f"{unit} taken from other tensors{pair}: {pieces}")


def _gate_up_pair(a: str, b: str) -> bool:
    return {a.replace("gate_proj", "X").replace("up_proj", "X")} == {
        b.replace("gate_proj", "X").replace("up_proj", "X")
    }


def _qk_pair(a: str, b: str) -> bool:
    return {re.sub(r"[qkv]_proj", "X", a)} == {re.sub(r"[qkv]_proj", "X", b)}


def diagnose(name: str, expected: Any, actual: Any, others: Mapping[str, Any] | None = None) -> Diagnosis | None:
    """The rearrangement that turns source `expected` (named `name`) into `actual`, or None.

    `others` are further source tensors (by name) the export may have taken rows from (siblings, experts); any
    tensor may sit on any device.
    """
    if expected.dtype != actual.dtype:
        return None
    expected, actual = together(expected, actual)
    if expected.dim() == 2 and tuple(actual.shape) == tuple(expected.shape[::-1]):
        if bool((int_view(actual.t()) == int_view(expected)).all()):
            return Diagnosis(kind="transpose", text="export is the source transposed ([in, out] instead of [out, in])")
    candidates = {name: expected}
    for other, tensor in (others or {}).items():
        if other != name and tensor.dtype == expected.dtype and tensor.dim() == expected.dim():
            candidates[other] = tensor
    for dim in range(min(expected.dim(), 2)):
        if actual.dim() != expected.dim():
            break
        rest = [d for i, d in enumerate(expected.shape) if i != dim]
        if [d for i, d in enumerate(actual.shape) if i != dim] != rest:
            continue
        sources = {
            n: _rows(t, dim) for n, t in candidates.items() if [d for i, d in enumerate(t.shape) if i != dim] == rest
        }
        segs = _segments(_rows(actual, dim), sources)
        if not segs:
            continue
        found = _describe_dim(segs, name, expected.shape[dim], dim)
        if found is not None:
            return found
    if actual.dim() == expected.dim() + 1 and tuple(actual.shape[1:]) == tuple(expected.shape):
        for k in range(actual.shape[0]):
            if bool((int_view(actual[k]) == int_view(expected)).all()):
                return Diagnosis(
                    kind="stacked", text=f"export stacks {actual.shape[0]} tensors; the source is slice {k}"
                )
    return None


def sibling_names(name: str, names: Iterable[str], limit: int = 32) -> list[str]:
    """Source tensors an export bug may have taken rows from: same module, or the same name up to numbers."""
    return SiblingIndex(names).siblings(name, limit)


class SiblingIndex:
    """The names bucketed (sorted) by module and by digit-free pattern: each `siblings` call costs O(limit), so
    diagnosing every tensor of a large checkpoint stays linear in its tensor count."""

    def __init__(self, names: Iterable[str]) -> None:
        self._by_parent: dict[str, list[str]] = {}
        self._by_pattern: dict[str, list[str]] = {}
        for n in sorted(set(names)):
            self._by_parent.setdefault(n.rsplit(".", 2)[0], []).append(n)
            self._by_pattern.setdefault(_strip_digits(n), []).append(n)

    def siblings(self, name: str, limit: int = 32) -> list[str]:
        """What `sibling_names(name, names, limit)` returns: the first `limit` of each sorted bucket suffice."""
        heads = self._by_parent.get(name.rsplit(".", 2)[0], [])[: limit + 1]
        heads += self._by_pattern.get(_strip_digits(name), [])[: limit + 1]
        return sorted({n for n in heads if n != name})[:limit]
