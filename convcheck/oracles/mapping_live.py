"""The mapping oracle inside a running job (convcheck.live): the export of the trained weights against every rank's own
shards through convcheck's explicit mappings; there is no source, so the export stands where the source stood.

Every rank holds the exported HF tensors its covered parameters need as the export streams by (an export tap inside
an earlier oracle's drain, else a drain of its own) and compares its shard with the mapping's `to_shard` of them
(convcheck.rank.shard_match's tap, fed with the export). Where every rank's shard matched, the mapping rebuilds exactly
the export from the shards (`from_shards` inverts `to_shard`), so nothing is gathered. A parameter with a wrong shard
on some rank is gathered to rank 0, rebuilt and compared with one more export stream, naming the first wrong element
in HF coordinates; where the rebuild equals the export, the replicas of the parameter disagree.
"""

from __future__ import annotations

from typing import Any

from convcheck.compare.bits import compare_bits
from convcheck.compare.proven import ProvenBytes
from convcheck.errors import NotCovered
from convcheck.mappings import MappingError
from convcheck.mappings.check import shard_matches
from convcheck.oracles import mapping as base
from convcheck.rank.context import RankContext
from convcheck.rank.shard_match import ShardTap, names_and_registry
from convcheck.verdict import Finding, OracleVerdict, make_verdict


class LiveShardTap(ShardTap):
    """A shard tap fed by the export stream as an export consumer (convcheck.rank.export_pass): each tensor consumed
    is the export's."""

    fed: bool = False
    findings: list[Finding]
    exported: dict[str, int]

    def start(self) -> None:
        if not self.fed:  # a later stream (the localising one) changes nothing
            self.exported = {}

    def consume(self, name: str, tensor: Any) -> None:
        if self.fed:
            return
        self.exported[name] = tensor.nbytes
        self.offer(name, tensor)

    def finish(self, export_error: str | None = None) -> None:  # type: ignore[override]
        if self.fed:
            return
        super().finish()
        self.fed = True

    def _verify(self, param: str, hf: dict[str, Any]) -> None:
        mapping, tensor = self.registry.mappings[param], self.local[param]
        if shard_matches(mapping, hf, self.ctx.layout, self.ctx.coord, tensor, self.ctx.exports.proven_bytes):
            self.proven[param] = (tensor, tensor._version)
        else:
            self._name(param, mapping, hf, tensor)

    def _name(self, param: str, mapping: Any, hf: dict[str, Any], tensor: Any) -> None:
        """The finding of a shard that is not the mapping's to_shard of the export, with its first wrong element."""
        try:
            finding = compare_bits(param, mapping.to_shard(hf, self.ctx.layout, self.ctx.coord), tensor.detach())
        except MappingError as exc:
            finding = Finding(tensor=param, kind="mapping-error", message=str(exc))
        if finding is not None:
            where = f"rank {self.ctx.rank} ({base._label(self.ctx.coord)})"
            self.findings.append(Finding(
                tensor=param, kind=f"shard-{finding.kind}",
                message=f"{where} shard vs the explicit mapping's to_shard of the export: {finding.message}",
                detail={**finding.detail, "rank": self.ctx.rank, "coord": base._label(self.ctx.coord)},
            ))  # fmt: skip


def start(ctx: RankContext) -> LiveShardTap | None:
    """Collective: this rank's tap over the export (None where the registry cannot be built: the oracle says why)."""
    try:
        local, all_names, registry = names_and_registry(ctx)
    except MappingError:
        return None
    tap = LiveShardTap(ctx=ctx, registry=registry, all_names=all_names, local={})
    tap.findings, tap.exported = [], {}
    ctx.exports.proven_bytes = ProvenBytes()  # the differential's proved ranges, for this tap to look up
    maps = registry.mappings
    for name, tensor in local.items():
        mapping = maps.get(name)
        if mapping is None:
            continue
        tap.local[name] = tensor
        tap.needs[name] = set(mapping.hf_names)
        for hf in mapping.hf_names:
            tap.users.setdefault(hf, set()).add(name)
    tap.settle()
    return tap


def ride(ctx: RankContext) -> None:
    """Collective: feed this oracle's tap with the export an earlier oracle drains (convcheck.oracles.ride);
    where the registry cannot be built, nothing rides and `run` says why."""
    tap = start(ctx)
    if tap is not None:
        ctx.exports.shard_match = ctx.exports.add(tap)


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank's shards against the export; suspects rebuilt on rank 0 and compared with the export."""
    rode = ctx.exports.shard_match
    tap = rode if isinstance(rode, LiveShardTap) and rode.fed else None
    came_from = "shared (export tap)"
    if tap is None:
        try:
            names_and_registry(ctx)  # the same on every rank: NotCovered or MappingError before any drain
        except NotCovered as exc:
            return make_verdict(base.NAME, checked=0, findings=[], not_covered=str(exc)) if ctx.is_reporter else None
        except MappingError as exc:
            finding = Finding(tensor="<registry>", kind="no-mappings", message=str(exc))
            return make_verdict(base.NAME, checked=0, findings=[finding]) if ctx.is_reporter else None
        tap, came_from = _own_drain(ctx), "own drain"
    failure = ctx.export_failure()
    registry, covered = tap.registry, sorted(tap.local)
    maps = registry.mappings
    held = {n: maps[n].canonical(ctx.coord) for n in covered}
    nbytes = {n: tap.local[n].numel() * tap.local[n].element_size() for n in covered}
    unproven = [n for n in covered if n not in tap.proven]
    gathered = ctx.gather(([f.to_dict() for f in tap.findings], held, nbytes, unproven))
    findings = [Finding.from_dict(f) for part in gathered for f in part[0]]
    suspect = {n for part in gathered for n in part[3]} - set(registry.copies)
    mine, sizes = base._senders([part[:3] for part in gathered], ctx.rank)
    params = sorted(n for n in tap.all_names if n in maps and n not in registry.copies)
    owner = {hf: n for n in params for hf in maps[n].hf_names}
    shipping = base._Shipping(local=tap.local, held=held, mine=mine, sizes=sizes)
    mismatched = {hf: n for hf, n in owner.items() if n in suspect and hf in tap.exported}
    plan = ctx.gather(base._plan(mismatched, tap.exported) if ctx.is_reporter else None)[0]
    for batch in plan:
        findings += _localise(ctx, registry, batch, shipping)
    if not ctx.is_reporter:
        return None
    shards = base._ShardPhase(findings, len(covered), 0, owner, suspect, shipping)
    exports = base._ExportPhase({n: [] for n in tap.exported}, {}, failure, came_from)
    verdict = base._verdict(registry, tap.all_names, shards, exports, None)
    keep = ("gathers", "gather_bytes", "rebuilt_from_shards", "export")
    metrics = {k: v for k, v in verdict.metrics.items() if k in keep}
    return make_verdict(
        base.NAME, checked=verdict.checked, findings=list(verdict.findings), rows=verdict.rows, unit=verdict.unit,
        metrics={
            **metrics, "live": True, "in_export_s": round(tap.seconds, 3),
            "compares_proven_by_differential": proven.hits if (proven := ctx.exports.proven_bytes) is not None else 0,
        },
    )  # fmt: skip


def _own_drain(ctx: RankContext) -> LiveShardTap:
    """Collective: a tap fed by a drain of our own."""
    tap = start(ctx)
    assert tap is not None  # names_and_registry just succeeded on every rank
    tap.start()
    for name, tensor in ctx.export(cpu=ctx.device != "cuda"):
        tap.consume(name, tensor)
    tap.finish(ctx.export_error)
    return tap


def _localise(ctx: RankContext, registry: Any, batch: dict[str, list[str]], ship: Any) -> list[Finding]:
    """Collective: rebuild this batch's parameters from the gathered shards, stream the export once, name each HF
    tensor that differs by its first wrong element."""
    keep: dict[str, tuple[str, Any]] = {}
    findings: list[Finding] = []
    for megatron, shards in base._gathered(ctx, sorted(batch), ship):
        wanted = set(batch[megatron])
        try:
            for hf_name, tensor in registry.get(megatron).from_shards(shards, ctx.layout):
                if hf_name in wanted:
                    keep[hf_name] = (megatron, tensor)
        except MappingError as exc:  # rank 0 only: the others yield nothing
            findings.append(Finding(tensor=megatron, kind="mapping-error", message=str(exc)))
    for hf_name, tensor in ctx.export(cpu=ctx.device != "cuda"):
        if not ctx.is_reporter or hf_name not in keep:
            continue
        megatron, expected = keep.pop(hf_name)
        finding = compare_bits(hf_name, expected, tensor)
        if finding is not None:
            findings.append(Finding(
                tensor=hf_name, kind=f"export-{finding.kind}",
                message=f"bridge export vs explicit mapping of {megatron} (rebuilt from the shards): {finding.message}",
                detail={**finding.detail, "megatron": megatron},
            ))  # fmt: skip
    return findings
