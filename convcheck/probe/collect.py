"""Per-rank probe records for every conversion task, optionally checked against the real (communicating) export."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from convcheck.compare.bits import describe_element, int_view, unravel_index
from convcheck.compare.digest_queue import DigestQueue
from convcheck.compare.fold import quick_digest
from convcheck.compare.proven import ProvenBytes
from convcheck.probe.class_state import CarriesState
from convcheck.probe.hook import ExportHook, export_hook, hook_name
from convcheck.probe.run import CodeCache, own_view_slots, probe_task, range_labels, to_ranges
from convcheck.probe.runs import diff_positions, differing_runs, hf_ranges, views_inside
from convcheck.probe.shared import SharedProbes
from convcheck.probe.values import ValueMap, value_map
from convcheck.verdict import Finding

PROVEN_RUNS = 4
"""At most this many runs of one compare are noted as proved (convcheck.compare.proven): row blocks of a shard, which
the mapping tap compares again; a scattered layout's many runs it would not look up whole."""


@dataclass(frozen=True)
class ProbeRecords:
    """The probe's records of this run, held on the run's export pass for the differential and elements."""

    with_real: bool
    """Made with the real conversions' outputs."""
    records: list[dict[str, Any]]
    """One record per HF tensor of a conversion task."""
    origin: dict[str, Any] | None = None
    """Which export drain made them ({"in": oracle, "seconds": probe work there}); None: collect did."""
    shared: int = 0
    """Routed-expert tasks that took their layer's shared probe slots (convcheck.probe.shared)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text.splitlines()[0]}" if text else exc.__class__.__name__


def tasks_of(ctx: Any) -> list[Any]:
    """The bridge's conversion tasks for this rank's model, None entries dropped (same order on every rank)."""
    return [t for t in ctx.bridge.get_conversion_tasks(ctx.model) if t is not None]


def collect(ctx: Any, *, with_real: bool) -> list[dict[str, Any]]:
    """Collective: run each task's real megatron_to_hf (when `with_real`), then its probe; one record per HF tensor.
    Records an earlier drain kept are used only when every rank has them: a rank whose drain was not intact (its
    export called a mapping with other arguments, e.g. DeepSeek-V3's MTP layers at PP2) probes here, and its peers
    with it, or the bridge's collective task building would wait for them forever."""
    cached = ctx.exports.probe
    usable = cached is not None and (cached.with_real or not with_real)
    if ctx.world > 1:
        usable = all(ctx.gather(usable))
    if usable:
        return cached.records
    records: list[dict[str, Any]] = []
    codes, shared, digests = CodeCache(), SharedProbes(), DigestQueue()
    tasks = tasks_of(ctx)
    hook = export_hook(ctx, tasks)
    for index, task in enumerate(tasks):
        real: dict[str, Any] | BaseException | None = None
        version = weight_version(task)
        if with_real:
            try:
                real = dict(task.mapping.megatron_to_hf(task.param_weight, task.megatron_module) or {})
            except Exception as exc:  # noqa: BLE001 - a crashing export is a finding
                real = exc
        unwritten = version == weight_version(task)
        records.extend(
            task_records(
                ctx, index, task, real, codes, with_real=with_real, unwritten=unwritten, hook=hook, shared=shared,
                digests=digests,
            )
        )  # fmt: skip
    digests.flush()
    keep(ctx, records, with_real=with_real, shared=shared.shared)
    return records


def keep(
    ctx: Any, records: list[dict[str, Any]], *, with_real: bool, origin: dict[str, Any] | None = None, shared: int = 0
) -> None:
    """Hold this run's records on the run's export pass (convcheck.rank.export_pass) for the later oracles that ask
    for them (differential, elements); `origin` says which export drain made them and the seconds their probe work
    took there, `shared` how many tasks took shared probe slots."""
    ctx.exports.probe = ProbeRecords(with_real=with_real, records=records, origin=origin, shared=shared)


def origin(ctx: Any) -> dict[str, Any] | None:
    """Where the held records were made when not by `collect` itself (convcheck.probe.fused), else None."""
    return ctx.exports.probe.origin if ctx.exports.probe is not None else None


def weight_version(task: Any) -> int | None:
    """The version counter of the task's weight (it moves when anything writes into the weight in place)."""
    weight = task.param_weight
    return None if weight is None else weight._version


def task_records(
    ctx: Any,
    index: int,
    task: Any,
    real: Any,
    codes: CodeCache,
    *,
    with_real: bool,
    unwritten: bool = False,
    hook: ExportHook | None = None,
    shared: SharedProbes | None = None,
    proven: ProvenBytes | None = None,
    digests: DigestQueue | None = None,
) -> list[dict[str, Any]]:
    """One task's records: its probe slots, each checked against `real` (the task's real megatron_to_hf output,
    or what it raised) when `with_real`. When no gather is due, the real outputs are all views of the weight and the
    conversion wrote nothing into it (`unwritten`), their strides are the slots and the probe does not run. With the
    bridge's export `hook` (convcheck.probe.hook), both the probe's and the real outputs are followed through it.
    Routed experts share probe runs through `shared` (convcheck.probe.shared) when no hook follows them and their real
    outputs are at hand to be checked against the shared slots (never for the elements oracle's probe alone).
    What each compare proves equal goes into `proven` for the export's later checks of the same bytes. With
    `digests`, the cross-rank digests are filled in at its flush (the caller's, before the records are read).
    Whatever convcheck raises while recording is this rank's error record for the task (a probe-failed finding),
    never a raise out of the export."""
    param = str(getattr(task, "global_param_name", "") or task.param_name)
    base = {"task": index, "param": param}
    records: list[dict[str, Any]] = []
    if isinstance(real, BaseException):
        records.append({**base, "error": f"real megatron_to_hf raised {_first_line(real)}"})
        real = {}
    real = real or {}
    if with_real and hook is not None and real:
        try:
            real = hook(task, real)
        except Exception as exc:  # noqa: BLE001 - a crashing hook is a finding
            return [
                *records,
                {**base, "error": f"{hook_name(task)} raised {_first_line(exc)}"},
            ]
    try:
        return records + _checked(
            ctx, base, task, real, codes, with_real=with_real, unwritten=unwritten, hook=hook, shared=shared,
            proven=proven, digests=digests,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - convcheck's own error: a finding on this rank, never a raise out of
        # the export (its peers would wait for it in the next collective until the job's timeout)
        return [*records, {**base, "error": f"convcheck raised {_first_line(exc)} recording the real output"}]


def _checked(
    ctx: Any,
    base: dict[str, Any],
    task: Any,
    real: dict[str, Any],
    codes: CodeCache,
    *,
    with_real: bool,
    unwritten: bool,
    hook: ExportHook | None,
    shared: SharedProbes | None,
    proven: ProvenBytes | None,
    digests: DigestQueue | None,
) -> list[dict[str, Any]]:
    """task_records' records of the task's probe slots and real outputs (`base` in each)."""
    cross_rank = with_real and ctx.world > 1  # several ranks export each tensor: digests for the assembler
    values = value_map(task.mapping)
    try:
        fast = unwritten and no_gather_due(ctx, task)
        lean = _own_view_records(base, real, task.param_weight) if fast and with_real and values is None else None
        if lean is not None:
            return lean
        own = own_view_slots(real, task.param_weight) if fast else None
        slots = own or _probe(task, ctx.rank, codes, hook, shared if with_real else None)
    except CarriesState as exc:  # the probe is no evidence here: not covered, never a finding
        return [{**base, "not_covered": str(exc), "hf_names": hf_names(task.mapping)}]
    except Exception as exc:  # noqa: BLE001 - an unsupported pattern fails loud as a finding
        return [{**base, "error": f"probe failed: {_first_line(exc)}"}]
    records = []
    facts = shared.facts if shared is not None else None
    for name in sorted(set(slots) | set(real)):
        slot = slots.get(name)
        rec: dict[str, Any] = {**base, "hf": name} if slot is None else {**base, "hf": name, **_slot_facts(slot, facts)}
        if with_real:
            rec.update(
                _against_real(real.get(name), slot, task.param_weight, values, read_off=own is not None, proven=proven)
            )
            if cross_rank and rec["real"] is not None and _may_differ(ctx, slot, real[name]):
                if digests is None:
                    rec["real"]["digest"] = quick_digest(real[name])
                else:  # a GPU tensor's digest lands at the queue's flush, without a wait per tensor
                    digests.put(rec["real"], "digest", real[name])
        records.append(rec)
    return records


def _slot_facts(slot: Any, facts: dict[int, tuple[Any, Any, dict[str, Any]]] | None) -> dict[str, Any]:
    """A slot's record fields (shape, writer, HF ranges, owned); with `facts`, made once per runs tensor and shared by
    the slots renamed from one probe run (convcheck.probe.shared), whose records only read them."""
    held = None if facts is None else facts.get(id(slot.runs))
    if held is not None and held[0] is slot.runs and held[1] == (slot.shape, slot.writer, slot.owned):
        return held[2]
    made = {"shape": list(slot.shape), "writer": [list(w) for w in slot.writer], "ranges": hf_ranges(slot.runs),
            "owned": slot.owned}  # fmt: skip
    if facts is not None:
        facts[id(slot.runs)] = (slot.runs, (slot.shape, slot.writer, slot.owned), made)
    return made


def _own_view_records(base: dict[str, Any], real: dict[str, Any], weight: Any) -> list[dict[str, Any]] | None:
    """The records of a task whose real outputs are all views inside its own unwritten weight (runs.views_inside; None
    when one is not, or there is none): each element is the weight element its strides name (nothing to compare, no
    other rank's part, no digest), every HF element written once, by this rank alone. No gather of another rank can
    have made such an output (a gather returns new memory)."""
    if weight is None or not real:
        return None
    inside = views_inside(weight)
    out = []
    task, param = base["task"], base["param"]
    for name in sorted(real):
        tensor = real[name]
        if not inside(tensor):
            return None
        numel = tensor.numel()
        out.append({"task": task, "param": param, "hf": name, "shape": list(tensor.shape), "writer": [],
                    "ranges": [(0, numel)], "owned": numel, "real": _described(tensor)})  # fmt: skip
    return out


def _described(tensor: Any) -> dict[str, Any]:
    """The real output as a record holds it: shape, dtype, and the digest (filled in for the cross-rank check)."""
    dtype = tensor.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return {"shape": list(tensor.shape), "dtype": name, "digest": None}


_DTYPE_NAMES: dict[Any, str] = {}
"""torch dtype -> its name without `torch.` (str() of a dtype is slow enough to show at 3,000 tensors a check)."""


def _probe(task: Any, rank: int, codes: CodeCache, hook: ExportHook | None, shared: SharedProbes | None) -> Any:
    """The task's probe slots: its own probe run, or a routed expert's shared one when no export hook follows it."""
    if shared is None or hook is not None:
        return probe_task(task, rank, codes, hook)
    return shared.slots(task, rank, lambda: probe_task(task, rank, codes, None))


def no_gather_due(ctx: Any, task: Any) -> bool:
    """True when the task's mapping has no group of more than one rank to gather over: tensor and pipeline size 1,
    and for an expert parameter expert and expert-tensor size 1 too. Only then may the real output's own views
    stand in for the probe: elsewhere a view can be a gather that was skipped, which the probe's slots expose."""
    layout = ctx.layout
    if layout.tp > 1 or layout.pp > 1:
        return False
    expert = getattr(task.mapping, "is_expert", True)
    return not expert or (layout.ep == 1 and layout.etp == 1)


def _may_differ(ctx: Any, slot: Any, tensor: Any) -> bool:
    """False when this rank's output is all its own elements and no collective made it (no gather in its task, no
    pipeline stages to broadcast from): other ranks cannot have sent any of it, so there is nothing to compare."""
    if slot is None or slot.writer or ctx.layout.pp > 1:
        return True
    return slot.owned != tensor.numel()


def _against_real(
    tensor: Any,
    slot: Any,
    weight: Any,
    values: ValueMap | None = None,
    *,
    read_off: bool = False,
    proven: ProvenBytes | None = None,
) -> dict[str, Any]:
    """Compare this rank's probe slot with the real output bitwise, run by run on the weight's device (its digest,
    for the cross-rank check, is filled in by `collect`); the shard through `values` when its mapping declares an
    elementwise value map (convcheck.probe.values). Slots `read_off` the real output's own strides over the weight
    (own_view_slots) name the very memory each real element is, so there is nothing to compare. Runs proved equal
    are noted in `proven` (up to PROVEN_RUNS of them: a shard's row blocks, not a scatter)."""
    if tensor is None:
        return {"real": None}
    out: dict[str, Any] = {"real": _described(tensor)}
    if slot is None or slot.owned == 0:
        return out
    tensor = tensor.detach()
    if tensor.shape != tuple(slot.shape) or tensor.element_size() != weight.element_size():
        return out  # the assembler reports the shape / dtype difference
    if read_off and values is None:
        return out
    weight = weight.detach() if values is None else values.apply(weight)
    if values is not None:
        out["value_map"] = values.label
    moved = tensor.device != weight.device
    if moved:
        tensor = tensor.to(weight.device)
    bad_runs = differing_runs(tensor, weight, slot.runs)
    if not bad_runs and proven is not None and not moved and values is None and len(slot.runs) <= PROVEN_RUNS:
        for h, loc, n in slot.runs.tolist():  # what this compare proved, in the real output's and the shard's memory
            proven.note(tensor, h, weight, loc, n)
    if bad_runs:
        bad, src = diff_positions(int_view(tensor), int_view(weight), slot.runs[bad_runs])
        first = int(bad[0])
        out["mismatch"] = {
            "count": int(bad.numel()),
            "first": list(unravel_index(first, tuple(slot.shape))),
            "ranges": to_ranges(bad)[:64],
            "real": describe_element(tensor, first),
            "probe": describe_element(weight, int(src[0])),
        }
    return out


def first_outside(have: list[int] | tuple[int, ...], want: list[int] | tuple[int, ...]) -> list[int]:
    """The first index of shape `want` outside the smaller shape `have` (rows dropped: [rows_have, 0, ...])."""
    for d, (h, w) in enumerate(zip(have, want)):
        if h < w:
            return [0] * d + [h] + [0] * (len(want) - d - 1)
    return [0] * len(want)


def replica_writers(
    entries: list[tuple[int, dict[str, Any]]],
) -> tuple[dict[tuple[Any, ...], tuple[int, dict[str, Any]]], list[tuple[int, int]]]:
    """One writer per (task, writer coordinates) — replicas count once — and the replica rank pairs that disagree."""
    writers: dict[tuple[Any, ...], tuple[int, dict[str, Any]]] = {}
    disagree: list[tuple[int, int]] = []
    for r, e in entries:
        key = (e["task"], tuple(tuple(w) for w in e["writer"]))
        if key in writers:
            if [list(x) for x in writers[key][1]["ranges"]] != [list(x) for x in e["ranges"]]:
                disagree.append((writers[key][0], r))
            continue
        writers[key] = (r, e)
    return writers, disagree


def hf_names(mapping: Any) -> list[str]:
    """The HF tensor names a resolved mapping names (its hf_param: one name, or a dict of them)."""
    names = mapping.hf_param
    return sorted(map(str, names.values())) if isinstance(names, dict) else [str(names)]


@dataclass(frozen=True)
class Uncovered:
    """The tasks whose probe is no evidence (records with `not_covered`) and the HF tensors they name."""

    params: frozenset[str]
    hf: frozenset[str]
    reason: str
    """One line for the verdict's not_covered; empty when every task was probed."""


def uncovered(gathered: list[list[dict[str, Any]]]) -> Uncovered:
    """Every rank's not-covered records (convcheck.probe.class_state) summed up: the oracles leave their tasks and
    HF tensors out and say so."""
    recs = [rec for records in gathered for rec in records if "not_covered" in rec]
    params = frozenset(rec["param"] for rec in recs)
    hf = frozenset(name for rec in recs for name in rec["hf_names"])
    if not recs:
        return Uncovered(params, hf, "")
    first = min(recs, key=lambda rec: rec["task"])
    reason = (
        f"{len(params)} task(s) the probe cannot follow, their {len(hf)} HF tensor(s) left to roundtrip and layout; "
        f"first {first['param']} ({', '.join(first['hf_names'])}): {first['not_covered']}"
    )
    return Uncovered(params, hf, reason)


def judged(gathered: list[list[dict[str, Any]]], left: Uncovered) -> list[tuple[int, dict[str, Any]]]:
    """(rank, record) of every record the differential and elements judge: those of the tasks `left` holds, and of
    the HF tensors they name, are left out."""
    return [
        (rank, rec)
        for rank, records in enumerate(gathered)
        for rec in records
        if rec["param"] not in left.params and rec.get("hf") not in left.hf
    ]


def probe_failed(rank: int, record: dict[str, Any]) -> Any:
    """The finding for a task whose probe raised on `rank`."""
    return Finding(
        tensor=record["param"], kind="probe-failed", message=f"rank {rank}: {record['error']}", detail={"rank": rank}
    )


def ranges_finding(tensor: str, kind: str, ranges: list[tuple[int, int]], shape: tuple[int, ...], what: str) -> Any:
    """A finding naming how many HF elements `ranges` cover, the first index and the ranges; None when empty."""
    if not ranges:
        return None
    where = range_labels(ranges, shape)
    first = list(unravel_index(ranges[0][0], tuple(shape)))
    count = sum(b - a for a, b in ranges)
    return Finding(
        tensor=tensor,
        kind=kind,
        message=f"{count} elements {what}; first at HF index {first}; ranges {', '.join(where)}",
        detail={"first_index": first, "ranges": where},
    )
