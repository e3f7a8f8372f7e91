"""The mapping oracle inside a running job (convcheck.live): the export of the trained weights against what the
explicit mappings rebuild from every rank's own shards; there is no source, so no shard is compared with one.

Every covered parameter is gathered to rank 0 in batches (the mapping oracle's shipping) and rebuilt with
`from_shards`; the rebuilt tensors' digests are compared with the export's, taken by an export tap inside an earlier
drain (`RunMemo.export_digests`) or by a drain of its own. A mismatch is localised by one more export stream that
names the first wrong element.
"""

from __future__ import annotations

from typing import Any

from convcheck.errors import NotCovered
from convcheck.mappings import MappingError
from convcheck.oracles import mapping as base
from convcheck.rank.context import RankContext
from convcheck.rank.export_digests import ExportDigests
from convcheck.rank.shard_match import names_and_registry
from convcheck.verdict import Finding, OracleVerdict, make_verdict


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: rank 0 compares the export with the tensors rebuilt from every rank's shards."""
    try:
        local, all_names, registry = names_and_registry(ctx)
    except NotCovered as exc:  # the same on every rank
        return make_verdict(base.NAME, checked=0, findings=[], not_covered=str(exc)) if ctx.is_reporter else None
    except MappingError as exc:
        finding = Finding(tensor="<registry>", kind="no-mappings", message=str(exc))
        return make_verdict(base.NAME, checked=0, findings=[finding]) if ctx.is_reporter else None
    shards = _shard_phase(ctx, registry, local, all_names)
    exported, failure, came_from = _export_digests(ctx)
    rebuilt = base._Digests()
    for name, parts in base._gathered(ctx, sorted(shards.suspect), shards.shipping):
        try:
            for hf_name, tensor in registry.get(name).from_shards(parts, ctx.layout):  # type: ignore[union-attr]
                rebuilt.add(hf_name, tensor, owner=name)
        except MappingError as exc:
            shards.findings.append(Finding(tensor=name, kind="mapping-error", message=str(exc)))
    ours = {hf: (megatron, d) for hf, megatron, d in rebuilt.results()}
    mismatched = {hf: m for hf, (m, d) in ours.items() if hf in exported and any(e != d for e in exported[hf])}
    sizes = {hf: base._nbytes(ours[hf][1]) for hf in mismatched}
    plan = ctx.gather(base._plan(mismatched, sizes) if ctx.is_reporter else None)[0]
    for batch in plan:
        shards.findings.extend(base._localise(ctx, registry, batch, shards.shipping, from_source=set()))
    if not ctx.is_reporter:
        return None
    exports = base._ExportPhase(exported, ours, failure, came_from)
    verdict = base._verdict(registry, all_names, shards, exports, None)
    metrics = {k: v for k, v in verdict.metrics.items() if k not in ("export_vs_source", "rank0_shards_in_roundtrip")}
    return make_verdict(
        base.NAME, checked=verdict.checked, findings=list(verdict.findings), rows=verdict.rows, unit=verdict.unit,
        metrics={**metrics, "live": True},
    )  # fmt: skip


def _shard_phase(ctx: RankContext, registry: Any, local: dict[str, Any], all_names: set[str]) -> Any:
    """Collective: every covered parameter is suspect (there is no source to clear it); who sends which shard."""
    covered = sorted(n for n in local if registry.get(n) is not None)
    held = {n: registry.get(n).canonical(ctx.coord) for n in covered}
    nbytes = {n: local[n].numel() * local[n].element_size() for n in covered}
    gathered = ctx.gather(([], held, nbytes))
    mine, sizes = base._senders(gathered, ctx.rank)
    params = sorted(n for n in all_names if registry.get(n) is not None and n not in registry.copies)
    owner = {hf: n for n in params for hf in registry.get(n).hf_names}
    shipping = base._Shipping(local=local, held=held, mine=mine, sizes=sizes)
    return base._ShardPhase([], len(covered), 0, owner, set(params), shipping)


def _export_digests(ctx: RankContext) -> tuple[dict[str, list[Any]], Finding | None, str]:
    """Rank 0's digests of every exported tensor (in yield order per name), the export's failure and where they were
    taken: the tap an earlier drain fed, else a drain of our own."""
    tap = ctx.memo.export_digests
    if isinstance(tap, ExportDigests) and tap.finished:
        return tap.by_name(), tap.failure, f"shared ({tap.by})"
    own = ExportDigests(reporter=ctx.is_reporter, by="own drain")
    own.start()
    for name, tensor in ctx.export(cpu=ctx.device != "cuda"):
        own.offer(name, tensor)
    own.finish(ctx.export_error)
    return own.by_name(), ctx.export_failure(), "own drain"
