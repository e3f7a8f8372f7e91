"""Layout oracle: the export at the requested layout equals the source byte for byte; a tensor that does not is
attributed by a TP1 export (layout-dependent, or the same at TP1).

Design: the source is the layout-free fixed point, so rank 0 compares each exported tensor with the source bytes
(convcheck.rank.source_match: roundtrip's drain when it ran) and needs no second launch when every tensor equals;
a difference is explained from one more stream of the export. Only when some differ
does the engine run a separate 1-rank TP1 job afterwards (convcheck.engine.reference, cached by content) that
writes a digest manifest; `attribute` then tells, per differing tensor, whether TP1 exports the same wrong bytes
(not layout-dependent: a mapping bug) or other bytes (the layout changes the export).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from convcheck.atomic import write_json_atomic
from convcheck.cache import loaded_sources
from convcheck.compare.bits import compare_bits, same_tensor, tensor_sha256
from convcheck.compare.diagnose import SiblingIndex, diagnose
from convcheck.compare.hashpool import HashPool
from convcheck.hf.tensors import TensorReader
from convcheck.oracles import ORACLES
from convcheck.oracles.attribution import DIFFERS, PENDING, retag
from convcheck.rank.context import RankContext
from convcheck.rank.source_match import source_match
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "layout"
INFO = ORACLES[NAME]


def digest(tensor: Any) -> dict[str, Any]:
    """dtype, shape and sha256 of the raw bytes of one tensor."""
    return {
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "sha256": tensor_sha256(tensor),
    }


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains the export; rank 0 writes the manifest (reference job) or compares with the
    source."""
    if ctx.write_manifest:
        return _write_reference(ctx, Path(ctx.write_manifest))

    match = source_match(ctx)  # roundtrip's drain when it ran, else one of our own
    if match.clean:
        if not ctx.is_reporter:
            return None
        rows = tuple(TensorRow(tensor=n, shape=shape, dtype=dtype, verdict="pass")
                     for n, (shape, dtype) in sorted(match.kinds.items()))  # fmt: skip
        metrics = {"reference": "source", "export": match.by}
        return make_verdict(NAME, checked=len(rows), findings=[], rows=rows, metrics=metrics)
    findings, rows = _against_source(ctx)  # something differs: stream again to explain each difference
    if not ctx.is_reporter:
        return None
    checked = len(rows)
    at_tp1 = ctx.layout.world_size == 1
    if at_tp1:  # this run is the reference layout: a difference is the TP1 export's own
        findings = [retag(f, "tp1-differs-from-source", "at TP1") if f.kind == DIFFERS else f for f in findings]
    if not findings:
        return make_verdict(NAME, checked=checked, findings=[], rows=rows, metrics={"reference": "source"})
    metrics = {"reference": "source"} if at_tp1 else {"reference": "source", PENDING: "pending"}
    return make_verdict(NAME, checked=checked, findings=findings, rows=rows, metrics=metrics)


def _against_source(ctx: RankContext) -> tuple[list[Finding], tuple[TensorRow, ...]]:
    """Collective: drain the export; rank 0 compares each tensor with the source on its device and explains every
    one that differs (digest, first differing index, rearrangement diagnosis)."""
    reader = TensorReader(ctx.checkpoint) if ctx.is_reporter else None
    source = ctx.checkpoint.tensors
    findings: list[Finding] = []
    rows: list[TensorRow] = []
    seen: set[str] = set()
    siblings = None
    for name, tensor in ctx.export(cpu=ctx.device != "cuda"):
        if reader is None:
            continue
        seen.add(name)
        src = reader.get(name) if name in source else None
        same = src is not None and same_tensor(src, tensor)
        if not same:
            siblings = siblings if siblings is not None else SiblingIndex(source)  # built at the first difference
            findings.append(_explain(ctx, name, tensor, src, reader, siblings))
        dtype = str(tensor.dtype).removeprefix("torch.")
        rows.append(TensorRow(tensor=name, shape=tuple(tensor.shape), dtype=dtype, verdict="pass" if same else "fail"))
    if reader is None:
        return [], ()
    if (failure := ctx.export_failure()) is not None:
        findings.insert(0, failure)
    for name in sorted(set(source) - seen):
        findings.append(
            Finding(tensor=name, kind="missing", message=f"in the source, not in the {ctx.layout.label} export")
        )
    return findings, tuple(sorted(rows, key=lambda r: r.tensor))


def _explain(ctx: RankContext, name: str, tensor: Any, src: Any, reader: Any, siblings: Any) -> Finding:
    """The `differs-from-source` finding of one exported tensor, with its digest for the TP1 attribution."""
    detail: dict[str, Any] = {"digest": digest(tensor)}
    if src is None:
        message = f"in the {ctx.layout.label} export, not in the source"
        return Finding(tensor=name, kind=DIFFERS, message=message, detail=detail)
    against = compare_bits(name, src.to(tensor.device), tensor)
    message = f"differs from the source at {ctx.layout.label}: {against.message if against else 'bytes'}"
    if against is not None:
        detail.update({k: v for k, v in against.detail.items() if k in ("first_index", "count")})
    found = diagnose(name, src, tensor.cpu(), {n: reader.get(n) for n in siblings.siblings(name)})
    if found is not None:
        message += f"; diagnosis: {found.text}"
        detail["diagnosis"] = found.text
    return Finding(tensor=name, kind=DIFFERS, message=message, detail=detail)


def _write_reference(ctx: RankContext, path: Path) -> OracleVerdict | None:
    """Reference job: digest every exported tensor (hashed on worker threads) into the manifest at `path`."""
    pool = HashPool() if ctx.is_reporter else None
    digests: dict[str, dict[str, Any]] = {}
    for name, tensor in ctx.export():
        if pool is not None:
            digests[name] = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
            pool.submit(name, tensor)
    if pool is None:
        return None
    for name, sha in pool.results().items():
        digests[name]["sha256"] = sha
    manifest = {"layout": ctx.layout.to_dict(), "export_error": ctx.export_error, "tensors": digests}
    write_json_atomic(path, {**manifest, "sources": loaded_sources()})
    return make_verdict(NAME, checked=len(digests), findings=[])
