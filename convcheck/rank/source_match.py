"""The export against the source bytes, tensor by tensor, in one drain: the roundtrip oracle's compare, the distckpt
phases' compare, and the per-name equality the layout and mapping oracles reuse (a default run pays for it once)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from convcheck.compare.bits import compare_bits
from convcheck.compare.diagnose import SiblingIndex, diagnose
from convcheck.hf.tensors import TensorReader
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, TensorRow


@dataclass
class SourceMatch:
    """Rank 0: each exported name's (shape, dtype) and whether every yield of it equals the source tensor; every
    rank: `clean` (all names equal, none missing, the stream ran to its end)."""

    clean: bool
    by: str
    """What drained the export for it: an oracle's name, or "own drain"."""
    equal: dict[str, bool] = field(default_factory=dict)
    kinds: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    failure: Finding | None = None


@dataclass
class Comparison:
    """Rank 0's answer of one drain: tensors compared, findings (with a diagnosis where one explains a difference,
    and the source tensors the export never yielded) and one row per name."""

    checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    rows: dict[str, TensorRow] = field(default_factory=dict)


def compare_to_source(ctx: RankContext, tap: Any = None) -> Comparison:
    """Collective: every rank drains the export (it runs the gathers); rank 0 compares each tensor with the source on
    the run's device (the source tensor travels, the export stays). `tap` (rank 0 gets each source tensor read, the
    others each name) rides on the drain (convcheck.rank.shard_match)."""
    reader = TensorReader(ctx.checkpoint) if ctx.is_reporter else None
    source = ctx.checkpoint.tensors
    out = Comparison()
    siblings = None  # a SiblingIndex of the source names, built at the first differing tensor
    for name, tensor in ctx.export(cpu=ctx.device != "cuda"):
        if reader is None:
            if tap is not None:
                tap.offer(name)
            continue
        if name not in source:
            out.findings.append(Finding(tensor=name, kind="unexpected", message="exported tensor is not in the source"))
            out.rows[name] = TensorRow(tensor=name, shape=tuple(tensor.shape), dtype=_dt(tensor), verdict="fail")
            continue
        expected = reader.get(name).to(tensor.device)
        if tap is not None:
            tap.offer(name, expected)
        finding = compare_bits(name, expected, tensor)
        if finding is not None and finding.kind in ("bytes-differ", "shape"):
            siblings = siblings or SiblingIndex(source)
            finding = _with_diagnosis(finding, reader, name, tensor, siblings)
        out.checked += 1
        failed = finding is not None or name in out.rows and out.rows[name].verdict == "fail"
        if finding is not None:
            out.findings.append(finding)
        out.rows[name] = TensorRow(
            tensor=name, shape=tuple(tensor.shape), dtype=_dt(tensor), verdict="fail" if failed else "pass"
        )
    if tap is not None:
        tap.finish()
    return out


def missing_from_export(ctx: RankContext, found: Comparison) -> None:
    """Rank 0: add the export's own failure and a `missing` finding and row for every source tensor never yielded."""
    if (failure := ctx.export_failure()) is not None:
        found.findings.append(failure)
    source = ctx.checkpoint.tensors
    for name in sorted(set(source) - set(found.rows)):
        found.findings.append(Finding(tensor=name, kind="missing", message="source tensor is missing from the export"))
        entry = source[name]
        found.rows[name] = TensorRow(tensor=name, shape=entry.shape, dtype=entry.torch_dtype, verdict="missing")


def _with_diagnosis(finding: Finding, reader: TensorReader, name: str, tensor: Any, siblings: SiblingIndex) -> Finding:
    """Add the rearrangement that explains a differing export (convcheck.compare.diagnose), when one does."""
    others = {n: reader.get(n) for n in siblings.siblings(name)}
    found = diagnose(name, reader.get(name), tensor, others)
    if found is None:
        return finding
    detail = {**finding.detail, "diagnosis": found.text, "diagnosis_kind": found.kind}
    return Finding(tensor=name, kind=finding.kind, message=f"{finding.message}; diagnosis: {found.text}", detail=detail)


def _dt(tensor: Any) -> str:
    return str(getattr(tensor, "dtype", "?")).removeprefix("torch.")


def record(ctx: RankContext, equal: dict[str, bool], kinds: dict[str, Any], by: str) -> SourceMatch:
    """Collective: keep rank 0's per-name equality of a drain that just ended as this run's source match."""
    failure = ctx.export_failure()
    clean = ctx.is_reporter and failure is None and all(equal.values()) and set(ctx.checkpoint.tensors) <= set(equal)
    clean = all(ctx.gather(bool(clean) if ctx.is_reporter else True))
    ctx.exports.source_match = SourceMatch(clean=clean, by=by, equal=equal, kinds=dict(kinds), failure=failure)
    return ctx.exports.source_match


def record_comparison(ctx: RankContext, found: Comparison, by: str) -> SourceMatch:
    """Collective: `record` the per-name equality of a `compare_to_source` drain."""
    source = ctx.checkpoint.tensors
    equal = {n: r.verdict == "pass" and n in source for n, r in found.rows.items()}
    return record(ctx, equal, {n: (r.shape, r.dtype) for n, r in found.rows.items()}, by=by)


def source_match(ctx: RankContext) -> SourceMatch:
    """Collective: this run's source match, draining the export (on the run's device) only if nothing recorded it."""
    if isinstance(ctx.exports.source_match, SourceMatch):
        return ctx.exports.source_match
    return record_comparison(ctx, compare_to_source(ctx), by="own drain")
