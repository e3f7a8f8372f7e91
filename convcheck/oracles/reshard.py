"""Reshard oracle: target shards at another TP/EP, assembled slice by slice from the trainer ranks' loaded Megatron
shards, equal bitwise the reference target shards computed from the HF tensors (convcheck.reshard)."""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch

from convcheck.compare.bits import compare_bits
from convcheck.hf.tensors import TensorReader
from convcheck.oracles import ORACLES
from convcheck.rank.context import RankContext
from convcheck.reshard import roles as role_mod
from convcheck.reshard.execute import allgather_baseline, execute
from convcheck.reshard.plan import build_plan, coverage
from convcheck.reshard.target import TargetLayout, reference_shard
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "reshard"
INFO = ORACLES[NAME]


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: roles and shard metadata are gathered, every rank plans, the executor moves the slices."""
    records, tensors, findings = role_mod.collect(ctx)
    roles, shards, merged = role_mod.merge(ctx.gather(records))
    if ctx.is_reporter:
        findings += merged + [f for f in map(role_mod.role_mismatch, roles.values()) if f is not None]
    experts = int(getattr(ctx.model[0].config, "num_moe_experts", None) or 0)
    rows: list[tuple[str, str]] = []
    metrics: dict[str, Any] = {}
    checked = 0
    for tp, ep, etp in itertools.product(ctx.targets.tps, ctx.targets.eps, ctx.targets.etps):
        layout = TargetLayout(tp=tp, ep=ep, etp=etp, num_experts=experts)
        found, counted, seen, measured = _one_layout(ctx, roles, shards, tensors, layout)
        findings += found
        checked += counted
        rows += seen
        metrics[layout.label] = measured
    gathered = ctx.gather(([f.to_dict() for f in findings], checked, rows, metrics))
    if not ctx.is_reporter:
        return None
    all_findings: list[Finding] = []
    verdicts: dict[str, str] = {}
    total = 0
    per_layout: dict[str, dict[str, Any]] = {}
    for rank_findings, rank_checked, rank_rows, rank_metrics in gathered:
        all_findings += [Finding.from_dict(f) for f in rank_findings]
        total += rank_checked
        for name, verdict in rank_rows:
            verdicts[name] = "fail" if "fail" in (verdict, verdicts.get(name)) else "pass"
        for label, m in rank_metrics.items():
            into = per_layout.setdefault(label, {"targets": {}, "received": {}, "seconds": 0.0, "allgather_s": 0.0})
            into["targets"].update(m["targets"])
            into["received"].update(m["allgather_received"])
            into["seconds"] = max(into["seconds"], m["seconds"])
            into["allgather_s"] = max(into["allgather_s"], m["allgather_seconds"])
    for label, m in per_layout.items():
        targets = [m["targets"][t] for t in sorted(m["targets"])]
        for target, t in enumerate(targets):
            if t["moved_bytes"] > t["shard_bytes"]:
                all_findings.append(
                    Finding(
                        tensor=f"<target {label} rank {target}>",
                        kind="over-fetch",
                        message=f"moved {t['moved_bytes']} bytes for a shard of {t['shard_bytes']}",
                        detail=t,
                    )
                )
        per_layout[label] = {
            **{key: [t[key] for t in targets] for key in ("shard_bytes", "moved_bytes", "remote_bytes")},
            "allgather_bytes": _allgather_bytes(roles, shards),
            "allgather_received_bytes": [m["received"][r] for r in sorted(m["received"])],
            "seconds": m["seconds"],
            "allgather_seconds": m["allgather_s"],
        }
    bad = {f.tensor for f in all_findings}
    table = tuple(
        TensorRow(tensor=n, shape=(), dtype="", verdict="fail" if n in bad or v == "fail" else "pass")
        for n, v in sorted(verdicts.items())
    )
    all_findings.sort(key=lambda f: (f.tensor, f.kind, f.message))
    return make_verdict(NAME, checked=total, findings=all_findings, unit="shards", rows=table, metrics=per_layout)


def _one_layout(
    ctx: RankContext, roles: dict[str, Any], shards: dict[str, Any], tensors: dict[str, Any], layout: Any
) -> tuple[list[Finding], int, list[tuple[str, str]], dict[str, Any]]:
    """Plan, execute and compare one target layout; this rank's findings, count, rows and byte metrics."""
    plans, findings = build_plan(roles, shards, layout, ctx.world)
    if not ctx.is_reporter:
        findings = []
    else:
        findings += [f for f in (coverage(p, shards) for p in plans) if f is not None]
        findings += placement_findings(plans, roles, layout, {f.tensor for f in findings})
    started = time.perf_counter()
    assembled, moved = execute(plans, tensors, ctx.rank, ctx.world, ctx.group("world"))
    seconds = time.perf_counter() - started
    baseline_bytes, baseline_s = allgather_baseline(tensors, ctx.world, ctx.group("world"))
    reader = TensorReader(ctx.checkpoint)
    rows: list[tuple[str, str]] = []
    for (target, name), tensor in sorted(assembled.items()):
        role = roles[name]
        expected = reference_shard(role, [reader.get(h) for h in role.hf], layout, target)
        found = compare_bits(name, expected, tensor.cpu())
        if found is not None:
            where = f"target {layout.label} rank {target}"
            findings.append(
                Finding(
                    tensor=name,
                    kind=found.kind,
                    message=f"{where}: {found.message}",
                    detail={**found.detail, "target": layout.label, "target_rank": target},
                )
            )
        rows.append((name, "fail" if found is not None else "pass"))
    targets = {
        target: {
            "shard_bytes": m.shard_bytes,
            "moved_bytes": m.moved_bytes,
            "remote_bytes": m.remote_bytes,
            "padding_bytes": m.padding_bytes,
        }
        for target, m in moved.items()
    }
    measured = {"targets": targets, "seconds": round(seconds, 6), "allgather_seconds": round(baseline_s, 6)}
    return findings, len(assembled), rows, {**measured, "allgather_received": {ctx.rank: baseline_bytes}}


def placement_findings(plans: list[Any], roles: dict[str, Any], layout: Any, skipped: set[str]) -> list[Finding]:
    """A finding per parameter whose planned target ranks differ from the ranks the reference layout gives it."""
    planned: dict[str, set[int]] = {}
    for plan in plans:
        planned.setdefault(plan.name, set()).add(plan.target)
    out = []
    for name, role in sorted(roles.items()):
        if name in skipped and name not in planned:
            continue
        want = {t for t in range(layout.world) if layout.holds(t, role.expert)}
        got = planned.get(name, set())
        if got != want:
            extra, missing = sorted(got - want), sorted(want - got)
            out.append(
                Finding(
                    tensor=name,
                    kind="plan-placement",
                    message=f"target {layout.label}: planned on target rank(s) {extra} that do not hold it, "
                    f"not planned on {missing} that do",
                    detail={
                        "target": layout.label,
                        "target_rank": (extra or missing)[0],
                        "extra": extra,
                        "missing": missing,
                    },
                )
            )
    return out


def _allgather_bytes(roles: dict[str, Any], shards: dict[str, Any]) -> int:
    """What an all-gather-then-slice baseline brings to every target rank: every full tensor of the model."""
    total = 0
    for name, role in roles.items():
        if shards.get(name):
            item = torch.empty((), dtype=getattr(torch, shards[name][0].dtype)).element_size()
            total += item * sum(int(torch.Size(shape).numel()) for shape in role.hf_shapes)
    return total
