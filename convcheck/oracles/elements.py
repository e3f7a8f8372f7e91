"""Elements oracle: every element of every source HF tensor is written exactly once across ranks.

The probe (convcheck.probe) runs each task's real megatron_to_hf over shards whose values encode (rank, local
flat index); decoding the output gives each rank's HF coordinates. Replica ranks (same gathers) count once.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from convcheck.oracles import ORACLES
from convcheck.probe.collect import (
    collect,
    first_outside,
    judged,
    probe_failed,
    ranges_finding,
    replica_writers,
    uncovered,
)
from convcheck.probe.run import where_hits, write_counts
from convcheck.rank.context import RankContext
from convcheck.verdict import NOT_COVERED, Finding, OracleVerdict, TensorRow, make_verdict

NAME = "elements"
INFO = ORACLES[NAME]


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank probes every task (no communication); rank 0 counts writes per HF element."""
    gathered = ctx.gather(collect(ctx, with_real=False))
    if not ctx.is_reporter:
        return None
    source = {name: tuple(entry.shape) for name, entry in ctx.checkpoint.tensors.items()}
    findings, proven = assemble(gathered, source)
    bad, left = {f.tensor for f in findings}, uncovered(gathered)
    rows = tuple(
        TensorRow(
            tensor=name,
            shape=shape,
            dtype=ctx.checkpoint.tensors[name].torch_dtype,
            verdict="fail" if name in bad else NOT_COVERED if name in left.hf else "pass",
        )
        for name, shape in sorted(source.items())
    )
    metrics = {"probes_shared": ctx.exports.probes_shared}  # slots the differential's records share (its real checks)
    return make_verdict(
        NAME, checked=proven, findings=findings, unit="elements", rows=rows, metrics=metrics,
        not_covered=left.reason,
    )  # fmt: skip


def assemble(gathered: list[list[dict[str, Any]]], source: dict[str, tuple[int, ...]]) -> tuple[list[Finding], int]:
    """Findings (gaps, overlaps, shape, never written, unexpected) and the count of elements proven written once."""
    findings: list[Finding] = []
    by_hf: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    left = uncovered(gathered)  # tasks the probe cannot follow and their HF tensors: out (the verdict says so)
    source = {name: shape for name, shape in source.items() if name not in left.hf}
    for rank, rec in judged(gathered, left):
        if "error" in rec:
            findings.append(probe_failed(rank, rec))
        elif "ranges" in rec:
            by_hf[rec["hf"]].append((rank, rec))
    proven = 0
    for name in sorted(set(source) - set(by_hf)):
        findings.append(
            Finding(
                tensor=name,
                kind="never-written",
                message="no rank's probe writes any element of this source tensor",
                detail={"first_index": [0] * len(source[name])},
            )
        )
    for name in sorted(set(by_hf) - set(source)):
        findings.append(
            Finding(
                tensor=name, kind="unexpected", message="the probe writes a tensor the source checkpoint does not have"
            )
        )
    for name in sorted(set(by_hf) & set(source)):
        want = source[name]
        wrong_shape = [(r, e) for r, e in by_hf[name] if tuple(e["shape"]) != want]
        shape_bad = wrong_shape[-1] if wrong_shape else None
        writers, disagree = replica_writers(by_hf[name])
        for a, b in disagree:
            findings.append(
                Finding(
                    tensor=name, kind="replica-layout", message=f"replica ranks {a} and {b} write different elements"
                )
            )
        if shape_bad is not None:
            r, e = shape_bad
            first = first_outside(e["shape"], want)
            findings.append(Finding(
                tensor=name, kind="shape",
                message=f"the export writes shape {e['shape']} but the source is {list(want)}: "
                f"elements from HF index {first} on are never written (rank {r}, {e['param']})",
                detail={"first_index": first, "rank": r},
            ))  # fmt: skip
            continue
        numel = 1
        for d in want:
            numel *= d
        pieces = write_counts(numel, [e["ranges"] for _, e in writers.values()])
        bad = [
            f
            for f in (
                ranges_finding(name, "gap", where_hits(pieces, lambda n: n == 0), want, "never written"),
                ranges_finding(
                    name, "overlap", where_hits(pieces, lambda n: n > 1), want, "written by more than one rank"
                ),
            )
            if f is not None
        ]
        findings += bad
        if not bad:
            proven += numel
    return findings, proven
