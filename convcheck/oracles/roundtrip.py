"""Roundtrip oracle: the bridge's HF export of the sharded model is byte-identical to the source checkpoint."""

from __future__ import annotations

from typing import Any

from convcheck.bits import compare_bits
from convcheck.checkpoint import TensorReader
from convcheck.oracles.base import OracleInfo
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "roundtrip"
INFO = OracleInfo(
    name=NAME,
    proves="HF -> sharded Megatron -> HF export is byte-identical to the source checkpoint, tensor by tensor "
    "(dtype, shape and raw bytes)",
    does_not_prove="that the Megatron shards are laid out as Megatron's forward expects: a bug made identically in "
    "import and export cancels out",
)


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains the export (it runs the gathers); rank 0 compares, one tensor at a time."""
    reader = TensorReader(ctx.checkpoint) if ctx.is_reporter else None
    source = ctx.checkpoint.tensors
    findings: list[Finding] = []
    rows: dict[str, TensorRow] = {}
    checked = 0
    siblings = None  # a SiblingIndex of the source names, built at the first differing tensor
    on_device = ctx.device == "cuda"  # compare in device memory: the source tensor travels, the export stays
    tap = ctx.shard_tap  # the mapping oracle's shard check rides on the source reads (convcheck.rank.shard_match)
    for name, tensor in ctx.export(cpu=not on_device):
        if reader is None:
            if tap is not None:
                tap.offer(name)
            continue
        if name not in source:
            findings.append(Finding(tensor=name, kind="unexpected", message="exported tensor is not in the source"))
            rows[name] = TensorRow(tensor=name, shape=tuple(tensor.shape), dtype=_dt(tensor), verdict="fail")
            continue
        expected = reader.get(name).to(tensor.device)
        if tap is not None:
            tap.offer(name, expected)
        finding = compare_bits(name, expected, tensor)
        if finding is not None and finding.kind in ("bytes-differ", "shape"):
            siblings = siblings or _sibling_index(source)
            finding = _with_diagnosis(finding, reader, name, tensor, siblings)
        checked += 1
        failed = finding is not None or rows.get(name, None) is not None and rows[name].verdict == "fail"
        if finding is not None:
            findings.append(finding)
        rows[name] = TensorRow(
            tensor=name, shape=tuple(tensor.shape), dtype=_dt(tensor), verdict="fail" if failed else "pass"
        )
    if tap is not None:
        tap.finish()
    from convcheck.rank.source_match import record

    equal = {n: r.verdict == "pass" and n in source for n, r in rows.items()}
    record(ctx, equal, {n: (r.shape, r.dtype) for n, r in rows.items()}, by=NAME)  # layout and mapping reuse it
    if reader is None:
        return None
    if (failure := ctx.export_failure()) is not None:
        findings.append(failure)
    for name in sorted(set(source) - set(rows)):
        findings.append(Finding(tensor=name, kind="missing", message="source tensor is missing from the export"))
        entry = source[name]
        rows[name] = TensorRow(tensor=name, shape=entry.shape, dtype=entry.torch_dtype, verdict="missing")
    return make_verdict(NAME, checked=checked, findings=findings, rows=tuple(rows[n] for n in sorted(rows)))


def _sibling_index(names: Any) -> Any:
    """A convcheck.diagnose.SiblingIndex of `names` (built once per run, not once per differing tensor)."""
    from convcheck.diagnose import SiblingIndex

    return SiblingIndex(names)


def _with_diagnosis(finding: Finding, reader: TensorReader, name: str, tensor: object, siblings: Any) -> Finding:
    """Add the rearrangement that explains a differing export (convcheck.diagnose), when one does."""
    from convcheck.diagnose import diagnose

    others = {n: reader.get(n) for n in siblings.siblings(name)}
    found = diagnose(name, reader.get(name), tensor, others)
    if found is None:
        return finding
    detail = {**finding.detail, "diagnosis": found.text, "diagnosis_kind": found.kind}
    return Finding(tensor=name, kind=finding.kind, message=f"{finding.message}; diagnosis: {found.text}", detail=detail)


def _dt(tensor: object) -> str:
    return str(getattr(tensor, "dtype", "?")).removeprefix("torch.")
