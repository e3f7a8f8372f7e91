"""Mapping oracle: the bridge's shards and export, compared bitwise with convcheck's own explicit mappings.

Every rank compares its shards with `to_shard` of the HF checkpoint. Where all of a parameter's shards match, the
mapping rebuilds exactly the source tensors from them (`from_shards` inverts `to_shard`, tests/test_mappings.py),
so rank 0 compares the export with the source bytes as it streams. Only parameters with a wrong shard ("suspect")
are gathered to rank 0 and rebuilt, in batches of at most `GATHER_BYTES` (one `gather_object` per batch), and their
export digests compared; a mismatch of either kind is localised by rebuilding it and re-streaming the export, keeping
at most `KEEP_BYTES` of rebuilt tensors per stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from convcheck.compare.bits import compare_bits, same_tensor
from convcheck.compare.hashpool import HashPool
from convcheck.errors import NotCovered
from convcheck.hf.tensors import TensorReader
from convcheck.mappings import MappingError, MappingRegistry, RankCoord
from convcheck.mappings.check import rows_match
from convcheck.oracles import ORACLES
from convcheck.rank import shard_match
from convcheck.rank.context import RankContext
from convcheck.rank.shard_match import names_and_registry
from convcheck.rank.source_match import source_match
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "mapping"
INFO = ORACLES[NAME]
KEEP_BYTES = 1 << 30
"""Rebuilt bytes of mismatching tensors rank 0 keeps for one extra export stream (one tensor if larger)."""

GATHER_BYTES = 64 << 20
"""Shard bytes (summed over the sending ranks) one gather to rank 0 carries; a larger parameter goes alone."""

Digest = tuple[str, tuple[int, ...], str]
"""(dtype, shape, sha256 of the raw bytes) of one tensor."""


def _import_findings(
    ctx: RankContext, registry: MappingRegistry, coord: RankCoord, local: list, tap: Any = None
) -> list[Finding]:
    """Each covered local shard vs `to_shard` of the HF checkpoint for this rank (those the tap proved inside
    roundtrip's drain are not read again)."""
    reader = TensorReader(ctx.checkpoint)
    findings = []
    for name, tensor in local:
        if tap is not None and tap.is_proven(name, tensor):
            continue
        mapping = registry.get(name)
        try:
            # the HF tensors travel to the shard's device once; to_shard's slices and concatenations run there
            hf = {n: reader.get(n).to(tensor.device) for n in mapping.hf_names if n in ctx.checkpoint.tensors}
            if rows_match(mapping, hf, ctx.layout, coord, tensor):
                continue  # equal block by block: no concatenated copy built
            expected = mapping.to_shard(hf, ctx.layout, coord)
        except MappingError as exc:
            findings.append(Finding(tensor=name, kind="mapping-error", message=str(exc), detail={"rank": ctx.rank}))
            continue
        finding = compare_bits(name, expected.to(tensor.device), tensor.detach())  # on the shard's device
        if finding is not None:
            findings.append(
                Finding(
                    tensor=name,
                    kind=f"import-{finding.kind}",
                    message=f"rank {ctx.rank} ({_label(coord)}) shard vs explicit mapping: {finding.message}",
                    detail={**finding.detail, "rank": ctx.rank, "coord": _label(coord)},
                )
            )
    return findings


def ride(ctx: RankContext) -> None:
    """Collective: check the shards inside roundtrip's source reads (convcheck.rank.shard_match), when roundtrip runs
    before this oracle (convcheck.oracles.ride)."""
    ctx.exports.shard_match = shard_match.start(ctx)


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank checks its shards against the explicit mappings; rank 0 checks the export against the
    source where every shard matched (the mappings rebuild the source from such shards) and against tensors rebuilt
    from the gathered shards elsewhere, re-streaming the export only to localise mismatches."""
    tap = ctx.exports.shard_match  # set on every rank or on none (convcheck.rank.shard_match.start is collective)
    if tap is not None:
        local = dict(ctx.named_parameters())
        all_names, registry = tap.all_names, tap.registry
    else:
        try:
            local, all_names, registry = names_and_registry(ctx)
        except NotCovered as exc:  # same on every rank: a family convcheck has no explicit mappings for
            return make_verdict(NAME, checked=0, findings=[], not_covered=str(exc)) if ctx.is_reporter else None
        except MappingError as exc:  # same on every rank (same config), so no rank is left in a collective
            finding = Finding(tensor="<registry>", kind="no-mappings", message=str(exc))
            return make_verdict(NAME, checked=0, findings=[finding]) if ctx.is_reporter else None
    shards = _check_shards(ctx, registry, local, all_names, tap)
    exports = _check_exports(ctx, registry, shards)
    if not ctx.is_reporter:
        return None
    return _verdict(registry, all_names, shards, exports, tap)


@dataclass
class _ShardPhase:
    """The shard phase's outcome, the same on every rank: findings so far (gathered), what the export is checked
    against, and what each rank ships when suspect parameters are rebuilt."""

    findings: list[Finding]
    covered: int
    """This rank's covered parameters."""
    in_drain: int
    """Of those, the ones the shard tap proved inside roundtrip's drain."""
    owner: dict[str, str]
    """HF name -> the Megatron parameter whose mapping produces it."""
    suspect: set[str]
    """Parameters with a wrong shard on some rank."""
    shipping: _Shipping


@dataclass
class _ExportPhase:
    """The export phase's outcome (rank 0's view)."""

    exported: dict[str, list[Digest]]
    ours: dict[str, tuple[str, Digest]]
    """HF name -> (Megatron parameter, digest) of the tensors rebuilt from gathered shards."""
    failure: Finding | None
    came_from: str


def _check_shards(
    ctx: RankContext, registry: MappingRegistry, local: dict[str, Any], all_names: set[str], tap: Any
) -> _ShardPhase:
    """Collective: each rank's covered shards vs the explicit mappings, the findings gathered to every rank."""
    coord = ctx.coord
    covered = sorted(((n, t) for n, t in local.items() if registry.get(n) is not None), key=lambda item: item[0])
    findings = _import_findings(ctx, registry, coord, covered, tap)
    in_drain = sum(1 for n, t in covered if tap is not None and tap.is_proven(n, t))
    held = {n: registry.get(n).canonical(coord) for n, _ in covered}  # type: ignore[union-attr]
    nbytes = {n: t.numel() * t.element_size() for n, t in covered}
    gathered = ctx.gather(([f.to_dict() for f in findings], held, nbytes))
    findings = [Finding.from_dict(f) for rank_findings, _, _ in gathered for f in rank_findings]
    mine, sizes = _senders(gathered, ctx.rank)
    del gathered
    params = sorted(n for n in all_names if registry.get(n) is not None and n not in registry.copies)
    owner = {hf: n for n in params for hf in registry.get(n).hf_names}  # type: ignore[union-attr]
    suspect = {f.tensor for f in findings} & set(params)  # same on every rank: the findings were gathered
    shipping = _Shipping(local=local, held=held, mine=mine, sizes=sizes)
    return _ShardPhase(findings, len(covered), in_drain, owner, suspect, shipping)


def _check_exports(ctx: RankContext, registry: MappingRegistry, shards: _ShardPhase) -> _ExportPhase:
    """Collective: the export vs the source (where every shard matched) and vs the suspect parameters rebuilt from
    their gathered shards; each mismatch localised by one more export stream. Findings go to `shards.findings`."""
    findings, shipping = shards.findings, shards.shipping
    exported, mismatched, export_failure, seen, export_from = _check_export(ctx, shards.owner, shards.suspect)
    rebuilt = _Digests()
    for name, parts in _gathered(ctx, sorted(shards.suspect), shipping):
        try:
            for hf_name, tensor in registry.get(name).from_shards(parts, ctx.layout):  # type: ignore[union-attr]
                rebuilt.add(hf_name, tensor, owner=name)
        except MappingError as exc:
            findings.append(Finding(tensor=name, kind="mapping-error", message=str(exc)))
    ours = {hf: (megatron, d) for hf, megatron, d in rebuilt.results()}  # the last rebuild of a name wins
    for hf, (megatron, d) in ours.items():
        if hf in exported and any(e != d for e in exported[hf]):
            mismatched[hf] = megatron
    sizes = {hf: _nbytes(ours[hf][1]) if hf in ours else seen[hf] for hf in mismatched}
    plan = ctx.gather(_plan(mismatched, sizes) if ctx.is_reporter else None)[0]
    for batch in plan:
        findings += _localise(ctx, registry, batch, shipping, from_source=set(mismatched) - set(ours))
    return _ExportPhase(exported, ours, export_failure, export_from)


def _verdict(
    registry: MappingRegistry, all_names: set[str], shards: _ShardPhase, exports: _ExportPhase, tap: Any
) -> OracleVerdict:
    """Rank 0: the verdict over every parameter and every HF name the mappings produce."""
    findings = shards.findings + _uncovered(registry)
    checked_exports = set(shards.owner) & set(exports.exported)
    for hf_name in sorted(set(shards.owner) - checked_exports):
        findings.append(Finding(tensor=hf_name, kind="not-exported", message="the bridge export never produced it"))
    if exports.failure is not None:
        findings.append(exports.failure)
    bad = {f.tensor for f in findings}
    rows = tuple(
        TensorRow(tensor=n, shape=(), dtype="?", verdict=_row_verdict(n, registry, bad)) for n in sorted(all_names)
    )
    covered_count = sum(1 for n in all_names if n in registry.mappings)
    unit = f"names ({covered_count} Megatron parameters + {len(checked_exports)} HF tensors)"
    metrics = {
        "gathers": shards.shipping.gathers,
        "gather_bytes": GATHER_BYTES,
        "rebuilt_from_shards": len(shards.suspect),
        "export_vs_source": len(checked_exports) - len(set(exports.ours) & checked_exports),
        "export": exports.came_from,
        "rank0_shards_in_roundtrip": f"{shards.in_drain}/{shards.covered}" if tap is not None else "none",
    }
    if tap is not None:
        metrics["in_export_s"] = round(tap.seconds, 3)
    checked = covered_count + len(checked_exports)
    return make_verdict(NAME, checked=checked, findings=findings, rows=rows, unit=unit, metrics=metrics)


def _check_export(
    ctx: RankContext, owner: dict[str, str], suspect: set[str]
) -> tuple[dict[str, list[Digest]], dict[str, str], Finding | None, dict[str, int], str]:
    """Collective: exported names (digests for suspect ones), source-checked mismatches, the export failure, the
    mismatches' sizes and where the answer came from (the run's shared source match when no shard was wrong and the
    export equals the source, else a drain of our own)."""
    if not suspect:
        match = source_match(ctx)
        if match.clean:
            return {n: [] for n in match.equal}, {}, None, {}, f"shared ({match.by})"
    seen = _ExportCheck(ctx, owner, suspect)
    for hf_name, tensor in ctx.export(cpu=ctx.device != "cuda"):
        seen.add(hf_name, tensor)
    export_failure = ctx.export_failure()  # read now: _localise re-streams the export
    exported, mismatched = seen.results()
    return exported, mismatched, export_failure, seen.nbytes, "own drain"


class _ExportCheck:
    """Rank 0's pass over the export: a tensor whose owning parameter's shards all matched is compared with the
    source bytes (what the mapping rebuilds from those shards); a suspect parameter's tensors are digested for the
    comparison with its rebuild."""

    def __init__(self, ctx: RankContext, owner: dict[str, str], suspect: set[str]) -> None:
        self.reader = TensorReader(ctx.checkpoint) if ctx.is_reporter else None
        self.owner, self.suspect, self.source = owner, suspect, ctx.checkpoint.tensors
        self.digests = _Digests()
        self.names: set[str] = set()
        self.mismatched: dict[str, str] = {}
        self.nbytes: dict[str, int] = {}

    def add(self, hf_name: str, tensor: Any) -> None:
        if self.reader is None:
            return
        self.names.add(hf_name)
        megatron = self.owner.get(hf_name)
        if megatron is None:
            return
        if megatron in self.suspect or hf_name not in self.source:
            self.digests.add(hf_name, tensor)
            return

        src = self.reader.get(hf_name)
        if not same_tensor(src, tensor):
            self.mismatched[hf_name] = megatron
            self.nbytes[hf_name] = src.numel() * src.element_size()

    def results(self) -> tuple[dict[str, list[Digest]], dict[str, str]]:
        """Exported names (with digests for the suspect ones, in yield order) and the source-checked mismatches."""
        exported: dict[str, list[Digest]] = {n: [] for n in self.names}
        for hf_name, _, d in self.digests.results():
            exported[hf_name].append(d)
        return exported, self.mismatched


def _senders(gathered: list[Any], rank: int) -> tuple[set[str], dict[str, int]]:
    """The names this rank sends (the lowest rank holding a canonical shard sends it) and each parameter's bytes
    summed over its senders, the same on every rank."""
    senders: dict[tuple[str, RankCoord], int] = {}
    sizes: dict[str, int] = {}
    for r, (_, rank_held, rank_bytes) in enumerate(gathered):
        for name, canonical in rank_held.items():
            if senders.setdefault((name, canonical), r) == r:
                sizes[name] = sizes.get(name, 0) + rank_bytes[name]
    mine = {n for (n, _), r in senders.items() if r == rank}
    return mine, sizes


def _uncovered(registry: MappingRegistry) -> list[Finding]:
    """The registry claims this architecture, so a parameter or HF tensor it does not map exactly once fails."""
    out = []
    for problem in registry.problems:
        name, _, what = problem.partition(": ")
        out.append(
            Finding(tensor=name, kind="uncovered", message=f"explicit mappings for {registry.architecture}: {what}")
        )
    return out


class _Digests:
    """Digests of a stream of (name, tensor), hashed on worker threads (compare.hashpool), read back in order."""

    def __init__(self) -> None:
        self._pool = HashPool()
        self._order: list[tuple[str, str, str, tuple[int, ...]]] = []

    def add(self, name: str, tensor: Any, owner: str = "") -> None:
        self._order.append((name, owner, str(tensor.dtype), tuple(tensor.shape)))
        self._pool.submit(len(self._order) - 1, tensor)

    def results(self) -> list[tuple[str, str, Digest]]:
        """(name, owner, (dtype, shape, sha256)) per added tensor, in the order added."""
        shas = self._pool.results()
        return [(name, owner, (dtype, shape, shas[i])) for i, (name, owner, dtype, shape) in enumerate(self._order)]


@dataclass
class _Shipping:
    """What this rank needs to send its shards to rank 0 in batches, and the count of gathers made."""

    local: dict[str, Any]
    held: dict[str, RankCoord]
    mine: set[str]
    sizes: dict[str, int]
    gathers: int = 0


def batches(names: list[str], sizes: dict[str, int], budget: int) -> list[list[str]]:
    """`names` in order, cut into runs whose summed sizes stay within `budget` (a larger name goes alone)."""
    out: list[list[str]] = []
    batch: list[str] = []
    used = 0
    for name in names:
        size = sizes.get(name, 0)
        if batch and used + size > budget:
            out.append(batch)
            batch, used = [], 0
        batch.append(name)
        used += size
    return out + [batch] if batch else out


def _gathered(ctx: RankContext, names: list[str], ship: _Shipping) -> Iterator[tuple[str, dict[RankCoord, Any]]]:
    """Collective: each parameter's shards, one per canonical coordinate, on rank 0, one `gather_object` per batch
    of at most GATHER_BYTES; other ranks yield nothing (but must drain it)."""
    for batch in batches(names, ship.sizes, GATHER_BYTES):
        parts = _gather_batch(ctx, [(n, ship.held[n], ship.local[n].detach().cpu()) for n in batch if n in ship.mine])
        ship.gathers += 1
        if parts is None:
            continue
        shards: dict[str, dict[RankCoord, Any]] = {n: {} for n in batch}
        for part in parts:
            for name, canonical, tensor in part:
                shards[name][canonical] = tensor
        del parts
        for name in batch:
            yield name, shards.pop(name)


def _gather_batch(ctx: RankContext, obj: list[Any]) -> list[list[Any]] | None:
    """Collective: every rank's list on rank 0 (None on other ranks)."""
    if ctx.world == 1:
        return [obj]

    parts: list[Any] | None = [None] * ctx.world if ctx.is_reporter else None
    dist.gather_object(obj, parts, dst=0)
    return parts


def _plan(mismatched: dict[str, str], sizes: dict[str, int]) -> list[dict[str, list[str]]]:
    """Mismatching HF names, batched by Megatron parameter so that each batch keeps at most KEEP_BYTES."""
    by_param: dict[str, list[str]] = {}
    for hf, megatron in sorted(mismatched.items()):
        by_param.setdefault(megatron, []).append(hf)
    plan: list[dict[str, list[str]]] = []
    batch: dict[str, list[str]] = {}
    used = 0
    for megatron, names in sorted(by_param.items()):
        for hf in names:
            if batch and used + sizes[hf] > KEEP_BYTES:
                plan.append(batch)
                batch, used = {}, 0
            batch.setdefault(megatron, []).append(hf)
            used += sizes[hf]
    return plan + [batch] if batch else plan


def _localise(
    ctx: RankContext,
    registry: MappingRegistry,
    batch: dict[str, list[str]],
    ship: _Shipping,
    from_source: set[str],
) -> list[Finding]:
    """Collective: rebuild this batch's mismatching tensors from the gathered shards, stream the export once, name
    each difference (`from_source`: found against the source, so a rebuild equal to the export is our mapping's
    fault)."""
    keep: dict[str, tuple[str, Any]] = {}
    for megatron, shards in _gathered(ctx, sorted(batch), ship):
        wanted = set(batch[megatron])
        try:
            for hf_name, tensor in registry.get(megatron).from_shards(shards, ctx.layout):  # type: ignore[union-attr]
                if hf_name in wanted:
                    keep[hf_name] = (megatron, tensor)
        except MappingError:  # already a finding from the first rebuild, after the names it yielded
            pass
        if ctx.is_reporter:  # a fused tensor no one parameter rebuilds: its shards matched, so the source is it
            reader = TensorReader(ctx.checkpoint)
            for hf_name in sorted(wanted & from_source - set(keep)):
                keep[hf_name] = (megatron, reader.get(hf_name))
    findings: list[Finding] = []
    named: set[str] = set()
    for hf_name, tensor in ctx.export():
        if not ctx.is_reporter or hf_name not in keep:
            continue
        megatron, expected = keep[hf_name]
        finding = compare_bits(hf_name, expected, tensor)
        if finding is not None:
            named.add(hf_name)
            findings.append(
                Finding(
                    tensor=hf_name,
                    kind=f"export-{finding.kind}",
                    message=f"bridge export vs explicit mapping of {megatron}: {finding.message}",
                    detail={**finding.detail, "megatron": megatron},
                )
            )
    for hf_name in sorted(set(keep) - named):  # the first pass differed, the rebuild matches the second stream
        if hf_name in from_source:
            message = (
                f"the export differs from the source, yet equals what the explicit mapping of {keep[hf_name][0]} "
                "rebuilds from shards that match its own to_shard: the mapping's from_shards is not to_shard's inverse"
            )
            findings.append(Finding(tensor=hf_name, kind="mapping-not-inverse", message=message))
            continue
        message = "the bridge export differed between two streams of the same model"
        findings.append(Finding(tensor=hf_name, kind="export-unstable", message=message))
    return findings


def _nbytes(d: Digest) -> int:
    numel = 1
    for dim in d[1]:
        numel *= dim
    return numel * getattr(torch, d[0].removeprefix("torch.")).itemsize


def _row_verdict(name: str, registry: MappingRegistry, bad: set[str]) -> str:
    if name not in registry.mappings:
        return "uncovered"
    return "fail" if name in bad else "pass"


def _label(coord: RankCoord) -> str:
    return f"tp{coord.tp_rank} ep{coord.ep_rank} etp{coord.etp_rank} pp{coord.pp_rank}"
