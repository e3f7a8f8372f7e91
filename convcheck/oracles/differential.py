"""Differential oracle: the real export (true collectives) equals the union over ranks of the comm-stub probe.

Each rank runs every task's real megatron_to_hf, then the probe (convcheck.probe) on an index-coded shard: the
probe says where each of this rank's elements must land. A rank checks its own elements bitwise against its
real output; rank 0 checks the real outputs a collective made agree across ranks (compare.fold.quick_digest: sha256
on the CPU and of small GPU tensors, a keyed fold of larger ones, queued by compare.digest_queue) and the probe slots
cover every element. The real conversions are those of an earlier export drain when one ran (convcheck.probe.fused).
Mappings that compute values rather than move them are reported (the probe follows codes, not arithmetic),
except the elementwise value maps convcheck.probe.values declares: their moves are probed and their values
compared bitwise against the declared map. Routed experts and the same task of successive layers share one probe run
(convcheck.probe.shared).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from convcheck.oracles import ORACLES
from convcheck.probe.collect import (
    collect,
    first_outside,
    judged,
    origin,
    probe_failed,
    ranges_finding,
    replica_writers,
    uncovered,
)
from convcheck.probe.run import where_hits, write_counts
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "differential"
INFO = ORACLES[NAME]


def ride(ctx: RankContext) -> None:
    """Probe inside the next full bridge export (convcheck.probe.fused), when an oracle before this one drains it
    (convcheck.oracles.ride)."""
    ctx.exports.probe_pending = True


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank probes and exports each task; rank 0 assembles per-task element counts."""
    records = collect(ctx, with_real=True)
    gathered = ctx.gather(records)
    if not ctx.is_reporter:
        return None
    findings, counts = assemble(gathered)
    made = origin(ctx)
    where = (
        {"real": "own conversions"}
        if made is None
        else {"real": f"shared ({made['in']} export)", "in_export_s": made["seconds"]}
    )
    where = {**where, "probes_shared": ctx.exports.probes_shared}
    return _verdict(findings, counts, where, not_covered=uncovered(gathered).reason)


def _verdict(
    findings: list[Finding], counts: dict[str, int], where: dict[str, Any] | None = None, not_covered: str = ""
) -> OracleVerdict:
    bad = {f.tensor for f in findings}
    rows = tuple(
        TensorRow(
            tensor=f"{param} [{n} elements]", shape=(), dtype="", verdict="fail" if param in bad or n == 0 else "pass"
        )
        for param, n in sorted(counts.items())
    )
    metrics = {"tasks": len(counts), "elements": sum(counts.values()), **(where or {})}
    return make_verdict(
        NAME, checked=sum(counts.values()), findings=findings, unit="elements", rows=rows, metrics=metrics,
        not_covered=not_covered,
    )  # fmt: skip


def assemble(gathered: list[list[dict[str, Any]]]) -> tuple[list[Finding], dict[str, int]]:
    """Findings and per-task checked-element counts from every rank's records, phase by phase per HF tensor: do the
    ranks agree on the real bytes, does each probe slot match the real export, is every element written once."""
    findings: list[Finding] = []
    counts: dict[str, int] = {}
    by_hf: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for rank, rec in judged(gathered, uncovered(gathered)):  # tasks the probe cannot follow: out (the verdict says so)
        counts.setdefault(rec["param"], 0)
        if "error" in rec:
            findings.append(probe_failed(rank, rec))
        else:
            by_hf[rec["hf"]].append((rank, rec))
    found: list[Finding] = []
    for hf, entries in sorted(by_hf.items()):
        if len(entries) == 1 and _whole_and_alone(entries[0][1]):
            counts[entries[0][1]["param"]] += entries[0][1]["owned"]  # what the phases below find nothing in
            continue
        probes = [(r, e) for r, e in entries if "ranges" in e]
        reals = [(r, e) for r, e in entries if e.get("real")]
        for task in sorted({e["task"] for _, e in reals}):  # a fused HF tensor is made by many tasks, each a part
            found += _ranks_disagree(hf, [(r, e) for r, e in reals if e["task"] == task])
        found += [f for r, e in probes for f in _slot_findings(hf, r, e)]
        if not probes:
            if reals:
                found.append(
                    Finding(tensor=hf, kind="unprobed", message="in the real export, but no probe slot writes it")
                )
            continue
        found += _written_once(hf, probes, reals, counts)
    findings += _first_of_each(found)
    named = {f.tensor for f in findings}
    owned = {e["param"] for es in by_hf.values() for _, e in es}
    findings += [
        Finding(tensor=param, kind="nothing-checked", message="the task exported nothing any probe could check")
        for param, n in counts.items()
        if n == 0 and param not in named and param not in owned
    ]
    return findings, counts


def _whole_and_alone(e: dict[str, Any]) -> bool:
    """True for the one record of an HF tensor (one rank, one task) whose probe writes every element once, in a real
    export of its shape, with no mismatch: no other rank to disagree with, nothing uncovered or written twice."""
    real = e.get("real")
    if not real or "mismatch" in e or "ranges" not in e or real["shape"] != e["shape"] or len(e["ranges"]) != 1:
        return False
    return tuple(e["ranges"][0]) == (0, math.prod(e["shape"]))


def _first_of_each(found: list[Finding]) -> list[Finding]:
    """The first finding of each (tensor, kind), in order."""
    seen: set[tuple[str, str]] = set()
    out = []
    for f in found:
        if (f.tensor, f.kind) not in seen:
            seen.add((f.tensor, f.kind))
            out.append(f)
    return out


def _ranks_disagree(hf: str, reals: list[tuple[int, dict[str, Any]]]) -> list[Finding]:
    """Ranks whose real export of `hf` differs (by digest), or that make it differently (collective or alone)."""
    digests: dict[Any, list[int]] = defaultdict(list)
    for r, e in reals:
        digests[e["real"]["digest"]].append(r)
    if None in digests and len(digests) > 1:  # a digest is skipped only for an output no collective made
        local, made = digests.pop(None), sorted(r for ranks in digests.values() for r in ranks)
        return [
            Finding(
                tensor=hf,
                kind="ranks-disagree",
                message=f"ranks {','.join(map(str, made))} build it through a collective, ranks "
                f"{','.join(map(str, sorted(local)))} from their own shard alone: the ranks do not agree on "
                "how it is made",
                detail={"rank_groups": [made, sorted(local)]},
            )
        ]
    if len(digests) <= 1:
        return []
    groups = sorted(sorted(ranks) for ranks in digests.values())
    shown = " vs ".join("ranks " + ",".join(map(str, g)) if len(g) > 1 else f"rank {g[0]}" for g in groups)
    return [
        Finding(
            tensor=hf,
            kind="ranks-disagree",
            message=f"the real export differs between ranks ({len(digests)} distinct byte strings: {shown}); "
            "each rank's own elements are where the probe puts them, so another rank's part differs",
            detail={"rank_groups": groups},
        )
    ]


def _slot_findings(hf: str, r: int, e: dict[str, Any]) -> list[Finding]:
    """Rank `r`'s probe slot of `hf` against the real export: missing there, another shape, elements elsewhere."""
    out = []
    if not e.get("real"):
        out.append(
            Finding(
                tensor=hf,
                kind="missing-in-real",
                message=f"rank {r}'s probe writes {e['owned']} elements of {hf} ({e['param']}) "
                "but the real export has no such tensor",
                detail={"rank": r, "first_index": [0] * len(e["shape"])},
            )
        )
    elif e["real"]["shape"] != e["shape"]:
        first = first_outside(e["real"]["shape"], e["shape"])
        out.append(
            Finding(
                tensor=hf,
                kind="shape",
                message=f"real shape {e['real']['shape']}, probe shape {e['shape']} (rank {r}); "
                f"first HF index the real export lacks: {first}",
                detail={"rank": r, "first_index": first},
            )
        )
    if "mismatch" in e:
        m = e["mismatch"]
        out.append(Finding(
            tensor=hf, kind="differs",
            message=f"rank {r}: {m['count']} of its elements are not where the probe puts them; "
            f"first at HF index {m['first']}: real {m['real']}, probe {m['probe']}{_mapped(e)} ({e['param']})",
            detail={"rank": r, "first_index": m["first"], "count": m["count"]},
        ))  # fmt: skip
    return out


def _mapped(e: dict[str, Any]) -> str:
    """` after x + 1 (Class)` when the probe's value went through the mapping's declared value map, else ''."""
    label = e.get("value_map")
    return f" after {label}" if label else ""


def _sole_writer(probes: list[tuple[int, dict[str, Any]]], numel: int) -> dict[str, Any] | None:
    """The one probe record that writes every element of the tensor when every other one writes none (an expert
    gathered over EP: its rank writes it, the others only receive it), none mismatched and no two of them replicas
    (one task and writer); else None."""
    whole = None
    keys = set()
    for _, e in probes:
        ranges = e["ranges"]
        if "mismatch" in e:
            return None
        if ranges:
            if whole is not None or len(ranges) != 1 or tuple(ranges[0]) != (0, numel):
                return None
            whole = e
        key = (e["task"], tuple(tuple(w) for w in e["writer"]))
        if key in keys:
            return None
        keys.add(key)
    return whole


def _written_once(
    hf: str, probes: list[tuple[int, dict[str, Any]]], reals: list[tuple[int, dict[str, Any]]], counts: dict[str, int]
) -> list[Finding]:
    """Replicas that place elements differently, elements no rank writes, and (where a slot mismatched) elements
    several write; adds each writer's owned elements to its task's count."""
    shape = reals[0][1]["real"]["shape"] if reals else probes[0][1]["shape"]
    numel = 1
    for d in shape:
        numel *= d
    whole = _sole_writer(probes, numel)
    if whole is not None:
        counts[whole["param"]] += whole["owned"]  # one writer of every element: nothing to find
        return []
    writers, disagree = replica_writers(probes)
    out = [
        Finding(
            tensor=hf,
            kind="replica-layout",
            message=f"ranks {a} and {b} are replicas but place their elements differently",
        )
        for a, b in disagree
    ]
    for _, e in writers.values():
        counts[e["param"]] += e["owned"]
    pieces = write_counts(numel, [e["ranges"] for _, e in writers.values()])
    uncovered = ranges_finding(
        hf, "uncovered", where_hits(pieces, lambda n: n == 0), tuple(shape), "no rank's probe writes"
    )
    out += [uncovered] if uncovered is not None else []
    if any("mismatch" in e for _, e in writers.values()):
        what = "written by several ranks with different bytes"
        conflict = ranges_finding(hf, "conflict", where_hits(pieces, lambda n: n > 1), tuple(shape), what)
        out += [conflict] if conflict is not None else []
    return out
