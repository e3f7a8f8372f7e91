"""Run the probe for one conversion task: index-coded shard in, HF coordinates of every owned element out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from convcheck.compare.bits import unravel_index
from convcheck.probe.class_state import CarriesState, ClassState
from convcheck.probe.hook import ExportHook, hook_made, hook_name
from convcheck.probe.runs import code_dtype, decode_runs, owned, shard_codes, view_runs
from convcheck.probe.stubs import (
    ProbeCommError,
    ProbeState,
    nested_mappings,
    no_communication,
    probe_copy,
    release,
    warm,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeSlot:
    """Where this rank's shard elements land in one HF tensor of one task."""

    hf_name: str
    shape: tuple[int, ...]
    runs: Any
    """int64 [k, 3] on the CPU: (hf_start, local_start, length) blocks, flat HF and shard indices advancing together,
    ascending by hf_start."""
    writer: tuple[tuple[str, int], ...]
    """The gathers (group kind, rank in group) the element went through: ranks with equal writers are replicas."""
    owned: int = -1
    """How many elements of the HF tensor this rank writes (counted from the runs when not given)."""

    def __post_init__(self) -> None:
        if self.owned < 0:
            object.__setattr__(self, "owned", owned(self.runs))


class CodeCache:
    """What one collection's probe runs keep between tasks. Index-coded shards reused by later tasks of the same
    shape, rank and device (experts share a few shapes); shards up to `max_bytes` each, the `size` most recent kept.
    A mapping that writes into one (its version counter moves) has it dropped, so every task starts from pristine
    codes. And `classes`: the probe's own copy of the mapping classes' class-level state
    (convcheck.probe.class_state)."""

    def __init__(self, size: int = 8, max_bytes: int = 64 << 20) -> None:
        self.size, self.max_bytes = size, max_bytes
        self.classes = ClassState()
        self._codes: dict[tuple[Any, ...], tuple[Any, Any, int]] = {}
        self._zeros: dict[tuple[Any, ...], Any] = {}
        self._zero_versions: dict[tuple[Any, ...], int] = {}

    def state(self) -> ProbeState:
        """A ProbeState for one run whose small placeholders are kept for later tasks (zeroed once per shape)."""
        return ProbeState(pool=self._zeros, versions=self._zero_versions)

    def get(self, shape: tuple[int, ...], rank: int, numel: int, device: Any) -> tuple[Any, Any, Any]:
        """(a fresh view of the codes, their dtype, a token for `release`: None when they are not kept)."""
        key = (shape, rank, numel, str(device))
        hit = self._codes.pop(key, None)
        if hit is None:
            codes, dtype = shard_codes(shape, rank, numel, device)
            if codes.numel() * codes.element_size() > self.max_bytes:
                return codes, dtype, None
            hit = (codes, dtype, codes._version)
        self._codes[key] = hit  # most recent last
        if len(self._codes) > self.size:
            self._codes.pop(next(iter(self._codes)))
        return hit[0].view(shape), hit[1], key

    def release(self, key: tuple[Any, ...] | None) -> None:
        """Drop the codes of `key` when the task wrote into them."""
        hit = self._codes.get(key) if key is not None else None
        if hit is not None and hit[0]._version != hit[2]:
            del self._codes[key]


UNFILLED_MIN = 1 << 22
"""Shards of at least this many elements are first probed with unfilled codes: when every output is a view of them,
the views' strides say where each element lands and the codes are never written (nor their pages touched)."""


def probe_task(
    task: Any, rank: int, cache: CodeCache | None = None, hook: ExportHook | None = None
) -> dict[str, ProbeSlot]:
    """Run the task's real megatron_to_hf on a probe copy of its mapping over an index-coded shard (on its device),
    then the bridge's export `hook` (convcheck.probe.hook) on its outputs when given."""
    weight = task.param_weight
    if weight is None:
        out, _, _, _ = _run(task, None, cache, hook)
        if out:
            raise ProbeCommError(
                f"probe: a rank without the parameter produced {next(iter(out))} (needs a PP broadcast)"
            )
        return {}
    numel, shape = weight.numel(), tuple(weight.shape)
    if numel >= UNFILLED_MIN:
        blank = _like(torch.empty(shape, dtype=code_dtype(rank, numel), device=weight.device), weight)
        try:
            out, state, pristine, _ = _run(task, blank, cache, hook)
        except CarriesState:
            raise  # a second run would meet the state the first one left
        except Exception:  # noqa: BLE001 - whatever the blank run met, the run with real codes decides
            out, state, pristine = {}, ProbeState(), False
        runs = {name: _view_runs(tensor, blank, state) for name, tensor in out.items()} if pristine else {}
        if runs and all(r is not None for r in runs.values()):
            return _slots(out, runs, state)
        del out, blank  # not all views: the values matter, probe again with real codes
    key = None
    if cache is not None:
        codes, dtype, key = cache.get(shape, rank, numel, weight.device)
    else:
        codes, dtype = shard_codes(shape, rank, numel, weight.device)
    try:
        out, state, pristine, hooked = _run(task, _like(codes, weight), cache, hook)
    finally:
        if cache is not None:
            cache.release(key)
    runs = {}
    for name, tensor in out.items():
        found = _view_runs(tensor, codes, state) if pristine else None  # a view: its strides say where
        try:
            runs[name] = found if found is not None else decode_runs(tensor, rank, numel, dtype)
        except ProbeCommError as exc:
            if name not in hooked:
                raise
            raise ProbeCommError(f"{name}, made by {hook_name(task)}: {exc}") from None
    return _slots(out, runs, state)


def own_view_slots(real: dict[str, Any], weight: Any) -> dict[str, ProbeSlot] | None:
    """Slots read off a real conversion whose every output is a view of this rank's own (unwritten) weight: its
    strides say where each element lands, no gather of another rank can have made it (a gather returns new memory),
    and its bytes are the weight's; None when any output is not such a view (then the probe runs)."""
    if weight is None or not real:
        return None
    slots = {}
    for name, tensor in real.items():
        runs = view_runs(tensor, weight)  # None for another dtype or memory
        if runs is None:
            return None
        slots[str(name)] = ProbeSlot(
            hf_name=str(name), shape=tuple(tensor.shape), runs=runs, writer=(), owned=tensor.numel()
        )  # every element of a view of the weight is this rank's
    return slots


def _view_runs(tensor: Any, codes: Any, state: ProbeState) -> Any | None:
    """Runs read without the values: none for a view of a placeholder (zeros, nothing of this rank), the strides'
    runs for a view of the unwritten codes; None otherwise."""
    if state.is_placeholder(tensor):
        return torch.zeros((0, 3), dtype=torch.int64)
    return view_runs(tensor, codes)


def _slots(out: dict[str, Any], runs: dict[str, Any], state: ProbeState) -> dict[str, ProbeSlot]:
    """One ProbeSlot per output tensor, from its runs."""
    writer = tuple(sorted(state.writer))
    return {
        str(n): ProbeSlot(hf_name=str(n), shape=tuple(out[n].shape), runs=r, writer=writer) for n, r in runs.items()
    }


def _like(codes: Any, weight: Any) -> Any:
    """`codes` carrying the weight's TP attributes (the mapping reads them)."""
    for attr in ("tensor_model_parallel", "partition_dim", "partition_stride"):
        if hasattr(weight, attr):
            setattr(codes, attr, getattr(weight, attr))
    return codes


def _run(
    task: Any, codes: Any, cache: CodeCache | None = None, hook: ExportHook | None = None
) -> tuple[dict[str, Any], ProbeState, bool, set[str]]:
    """(outputs, the run's ProbeState: placeholders and gathers, whether the codes are unwritten, the names the
    export hook made) of one probe run: the mapping's megatron_to_hf, then the hook on a copy of its outputs."""
    state = cache.state() if cache is not None else ProbeState()
    classes = cache.classes if cache is not None else ClassState()
    warm(task.mapping, task.megatron_module)
    mapping = probe_copy(task.mapping, state)
    version = None if codes is None else codes._version
    hooked: set[str] = set()
    with classes.isolated(nested_mappings(task.mapping)) as carried:
        try:
            with no_communication():  # the hook too: it must not gather either
                out = dict(mapping.megatron_to_hf(codes, task.megatron_module) or {})
                if hook is not None:
                    followed = hook(task, out)
                    out, hooked = followed, hook_made(out, followed)
        finally:
            release(mapping)
    if carried:
        raise CarriesState(
            f"{', '.join(carried)} (class-level state) carries values between this task and another: the probe "
            "cannot tell the other task's elements in an output from this one's"
        )
    pristine = codes is not None and codes._version == version  # nothing wrote into the codes
    state.check_pool()
    return out, state, pristine, hooked


def to_ranges(positions: Any) -> list[tuple[int, int]]:
    """Ascending flat positions as half-open (start, stop) runs."""
    if positions.numel() == 0:
        return []
    breaks = (positions[1:] - positions[:-1]).ne(1).nonzero().squeeze(1) + 1
    starts = torch.cat([positions[:1], positions[breaks]])
    stops = torch.cat([positions[breaks - 1] + 1, positions[-1:] + 1])
    return list(zip(starts.tolist(), stops.tolist()))


def write_counts(numel: int, writers: list[list[tuple[int, int]]]) -> list[tuple[int, int, int]]:
    """(start, stop, hits) pieces covering [0, numel): how many writers (each a list of ranges) cover each piece."""
    delta: dict[int, int] = {0: 0, numel: 0}
    for ranges in writers:
        for a, b in ranges:
            a, b = min(max(a, 0), numel), min(max(b, 0), numel)
            if a < b:
                delta[a] = delta.get(a, 0) + 1
                delta[b] = delta.get(b, 0) - 1
    points = sorted(delta)
    pieces, hits = [], 0
    for a, b in zip(points, points[1:]):
        hits += delta[a]
        pieces.append((a, b, hits))
    return pieces


def where_hits(pieces: list[tuple[int, int, int]], holds: Any) -> list[tuple[int, int]]:
    """Maximal half-open ranges of the pieces whose hit count satisfies `holds` (adjacent pieces merged)."""
    out: list[tuple[int, int]] = []
    for a, b, hits in pieces:
        if holds(hits):
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
    return out


def range_labels(ranges: list[tuple[int, int]], shape: tuple[int, ...], limit: int = 4) -> list[str]:
    """`[i, j]..[k, l]` HF index labels of the first `limit` flat half-open ranges."""
    return [f"{list(unravel_index(a, shape))}..{list(unravel_index(b - 1, shape))}" for a, b in ranges[:limit]]
