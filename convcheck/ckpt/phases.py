"""The two collective halves of a checkpoint check: save at one layout, resume at another and compare the export.

Both compare the bridge's HF export with the run's checkpoint through the roundtrip oracle (bitwise, with its
diagnosis), so "byte-identical" means the same thing here as everywhere in convcheck.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from convcheck.ckpt import optimizer as opt
from convcheck.ckpt.store import relabel, restore_checkpoint, restore_findings, save_checkpoint
from convcheck.errors import one_line
from convcheck.rank.context import RankContext
from convcheck.rank.memory import memory_mb, reset_peak
from convcheck.rank.source_match import compare_to_source, missing_from_export
from convcheck.verdict import Finding, TensorRow


@dataclass(kw_only=True)
class Phase:
    """What one phase found (meaningful on rank 0): tensors compared, findings, per-tensor rows, measurements."""

    checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    rows: tuple[TensorRow, ...] = ()
    metrics: dict[str, Any] = field(default_factory=dict)
    step: int | None = None
    """Resume: the step the checkpoint's common state records."""


def compare_export(ctx: RankContext, where: str) -> Phase:
    """Collective: the bridge's export of the model against ctx.checkpoint, bitwise (the roundtrip oracle's compare)."""
    found = compare_to_source(ctx)
    if not ctx.is_reporter:
        return Phase()
    missing_from_export(ctx, found)
    rows = tuple(found.rows[n] for n in sorted(found.rows))
    return Phase(checked=found.checked, findings=relabel(found.findings, where), rows=rows)


def save_phase(
    ctx: RankContext, folder: str | os.PathLike[str], *, step: int | None = None, compare: bool = True
) -> Phase:
    """Collective: (compare the export with the source, then) save model and, on CUDA, optimizer state as torch_dist."""
    where = f"saved at {ctx.layout.label}"
    phase = compare_export(ctx, where) if compare else Phase()
    extra, optimizer_note, failure = _optimizer_for_save(ctx, where)
    report = save_checkpoint(ctx, folder, step=step, extra=extra)
    if failure is not None:
        phase.findings.append(failure)
    if report.error:
        phase.findings.append(
            Finding(
                tensor="<checkpoint>",
                kind="save-failed",
                message=f"{where}: dist_checkpointing.save raised {report.error}",
                detail={"phase": where},
            )  # fmt: skip
        )
    phase.metrics = {
        "saved_at": ctx.layout.label,
        "sharded_keys": report.keys,
        "checkpoint_MB": round(report.bytes / 1e6, 3),
        "save_s": round(report.seconds, 2),
        "optimizer": optimizer_note,
    }
    return phase


def _optimizer_for_save(ctx: RankContext, where: str) -> tuple[Any, str, Finding | None]:
    """(the "optimizer" checkpoint entry or None, a note for the metrics, a finding when building it raised)."""
    reason = opt.not_run_reason(ctx)
    if reason is not None:
        return None, reason, None
    try:
        part = opt.build(ctx)
        opt.encode(part)
    except Exception as exc:  # noqa: BLE001 - reported, never a silent pass
        note = f"failed: {one_line(exc)}"
        return None, note, Finding(tensor="<optimizer>", kind="optimizer-failed", message=f"{where}: {note}")
    return opt.sharded_entries(part, loading=False), "moments encoded (parameter id, element)", None


def resume_phase(ctx: RankContext, folder: str | os.PathLike[str]) -> Phase:
    """Collective: restore `folder` into the fresh NaN-filled model (and optimizer), then compare its export."""
    where = f"resumed at {ctx.layout.label}"
    part, note, findings = None, opt.not_run_reason(ctx), []
    if note is None:
        try:
            part = opt.build(ctx)
            opt.fill_nan(part)
        except Exception as exc:  # noqa: BLE001 - reported, never a silent pass
            note = f"failed: {one_line(exc)}"
            findings.append(Finding(tensor="<optimizer>", kind="optimizer-failed", message=f"{where}: {note}"))
    extra = opt.sharded_entries(part, loading=True) if part is not None else None
    reset_peak()
    report, loaded = restore_checkpoint(ctx, folder, extra=extra)
    restore_peak = memory_mb().get("VmHWM", -1.0)
    findings += restore_findings(report, where)
    if part is not None and report.error is None:
        failures = [f for f in ctx.gather(opt.apply_loaded(part, loaded)) if f]
        if not failures:
            elements, optimizer_findings = opt.check(ctx, part, where)
            findings += optimizer_findings
            note = f"{elements} elements checked (exp_avg, exp_avg_sq, fp32 main param)"
        else:
            note = "restore failed"
            message = f"{where}: {failures[0]}"
            findings.append(Finding(tensor="<optimizer>", kind="optimizer-restore-failed", message=message))
    reset_peak()
    before_export = memory_mb()
    phase = compare_export(ctx, where)
    phase.findings = findings + phase.findings
    phase.step = report.step
    phase.metrics = {
        "resumed_at": ctx.layout.label,
        "restored_keys": report.keys,
        "load_s": round(report.seconds, 2),
        "optimizer": note,
        "rank0_restore_peak_MB": restore_peak,
        "rank0_rss_before_export_MB": before_export.get("VmRSS", -1.0),
        "rank0_export_peak_MB": memory_mb().get("VmHWM", -1.0),
    }
    return phase
