"""Delta oracle: a sparse delta in final HF coordinates turns the previous export into the new one, bitwise.

The ranks plant an in-place update (the lowest bit of a few elements of a few parameters flipped), export again
and restore the bits; rank 0 builds the delta between the two exports (convcheck.sync.delta), sends it through the
wire format and applies it to a copy of the previous export.
"""

from __future__ import annotations

from typing import Any

import torch

from convcheck.compare.bits import compare_bits, int_view
from convcheck.oracles import ORACLES, receiver_vllm
from convcheck.oracles.receiver_vllm import DeltaSteps
from convcheck.rank.context import RankContext
from convcheck.sync import delta as wire
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "delta"
INFO = ORACLES[NAME]
PARAMS = 3
ELEMENTS = 4


def _export(ctx: RankContext) -> dict[str, Any]:
    """Collective: drain the sender's stream; rank 0 keeps a copy of every tensor."""
    kept = {}
    for name, tensor in ctx.export():
        if ctx.is_reporter:
            kept[name] = tensor.detach().clone()
    return kept


def plant_update(ctx: RankContext) -> list[tuple[Any, Any]]:
    """Collective: flip the lowest bit of ELEMENTS evenly spaced elements of PARAMS parameters (first, middle and
    last of the sorted global names); returns what `undo` needs. Replicas get the same flips."""
    mine = {name: t for name, t in ctx.named_parameters() if t.is_floating_point() and t.is_contiguous()}
    names = sorted({n for rank_names in ctx.gather(sorted(mine)) for n in rank_names})
    chosen = {names[round(i * (len(names) - 1) / max(PARAMS - 1, 1))] for i in range(PARAMS)} if names else set()
    flipped = []
    for name in sorted(chosen & set(mine)):
        bits = int_view(mine[name].data)
        step = max(1, bits.numel() // ELEMENTS)
        positions = list(range(0, bits.numel(), step))[:ELEMENTS]
        bits[positions] ^= 1
        flipped.append((bits, positions))
    return flipped


def undo(flipped: list[tuple[Any, Any]]) -> None:
    """Flip the planted bits back (exact: XOR)."""
    for bits, positions in flipped:
        bits[positions] ^= 1


def check(previous: dict[str, Any], new: dict[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    """Findings and metrics for previous + delta(previous, new) == new and the empty-delta rules."""

    findings: list[Finding] = []
    try:
        delta = wire.build_delta(previous, new)
        encoded = wire.encode(delta)
        applied = wire.apply_delta(previous, wire.decode(encoded))
    except wire.DeltaError as exc:
        return [Finding(tensor="<delta>", kind="delta-apply-failed", message=str(exc))], {}
    if not delta.entries:
        findings.append(
            Finding(
                tensor="<delta>",
                kind="delta-empty",
                message="the planted in-place update does not show in the new export",
            )
        )
    findings += _state_findings(
        new,
        applied,
        "delta-mismatch",
        lambda name: f"missing from {'the new export' if name not in applied else 'previous + delta'}",
        "previous + delta differs from the new export",
    )
    findings += _empty_rules(previous)
    full = sum(t.numel() * t.element_size() for t in new.values())
    metrics = {
        "delta_tensors": len(delta.entries),
        "delta_elements": delta.elements,
        "delta_bytes": len(encoded),
        "full_bytes": full,
        "delta_fraction": round(len(encoded) / full, 6) if full else 0.0,
    }
    return findings, metrics


def _empty_rules(previous: dict[str, Any]) -> list[Finding]:
    """The delta of an unchanged state is empty; an empty delta (through the wire) changes nothing."""

    findings = []
    for entry in wire.build_delta(previous, previous).entries:
        findings.append(
            Finding(
                tensor=entry.name,
                kind="delta-not-empty",
                message=f"the delta of an unchanged export has a {entry.op} entry ({entry.values.numel()} elements)",
            )
        )
    try:
        same = wire.apply_delta(previous, wire.decode(wire.encode(wire.Delta())))
    except wire.DeltaError as exc:
        return findings + [Finding(tensor="<delta>", kind="empty-delta-not-noop", message=str(exc))]
    return findings + _state_findings(
        previous,
        same,
        "empty-delta-not-noop",
        lambda _: "an empty delta added or removed this tensor",
        "applying an empty delta changed it",
    )


def _state_findings(
    expected: dict[str, Any], actual: dict[str, Any], kind: str, absent: Any, differs_prefix: str
) -> list[Finding]:
    """One `kind` finding per name in only one state (`absent(name)` says why) or whose bits differ."""
    out = []
    for name in sorted(set(expected) | set(actual)):
        if name not in expected or name not in actual:
            out.append(Finding(tensor=name, kind=kind, message=absent(name)))
        elif (differs := compare_bits(name, expected[name], actual[name])) is not None:
            message = f"{differs_prefix}: {differs.message}"
            out.append(Finding(tensor=name, kind=kind, message=message, detail=differs.detail))
    return out


def before_and_after(ctx: RankContext) -> tuple[dict[str, Any], dict[str, Any], list[Finding]]:
    """Collective: export, plant the update, export again, restore -> (previous export, new export, the export
    failures of either); the exports are rank 0's copies (empty elsewhere)."""
    previous = _export(ctx)
    failure = ctx.export_failure()
    with torch.no_grad():
        flipped = plant_update(ctx)
        try:
            new = _export(ctx)
        finally:
            undo(flipped)
    return previous, new, [f for f in (failure, ctx.export_failure()) if f is not None]


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: export, plant the update, export again, restore; rank 0 checks the delta between the two."""
    if receiver_vllm.wanted(ctx):  # --receiver vllm: a real vLLM engine is the receiver
        return receiver_vllm.delta(ctx, DeltaSteps(exports=before_and_after, check=check))

    previous, new, findings = before_and_after(ctx)
    if not ctx.is_reporter:
        return None
    more, metrics = check(previous, new)
    return make_verdict(NAME, checked=len(new), findings=findings + more, metrics=metrics)
