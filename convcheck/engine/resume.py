"""The distckpt oracle's engine side: the checkpoint folder it owns, one resume launch per layout, one verdict.

The first launch saves into `Job.checkpoint_dir`; each resume job runs the same oracle at its own layout (and world
size) with `resuming` set, so its model is built but not loaded from HF. Their verdicts are folded into the first.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from convcheck.engine.job import Job
from convcheck.engine.launch import run_ranks
from convcheck.layout import ParallelLayout
from convcheck.progress import ProgressSink
from convcheck.verdict import Finding, OracleVerdict, TensorRow

ORACLE = "distckpt"
CHECKPOINT_SUBDIR = "distckpt-checkpoint"
"""Under --log-dir, where the checkpoint is kept (it is removed after the run otherwise)."""


@contextmanager
def checkpoint_folder(job: Job, log_dir: str | None = None) -> Iterator[Job]:
    """`job` with an empty checkpoint folder when it runs the distckpt oracle (kept under `log_dir`, else removed)."""
    if ORACLE not in job.oracles:
        yield job
        return
    if log_dir:
        folder = Path(log_dir) / CHECKPOINT_SUBDIR
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix="convcheck-distckpt-"))
    try:
        yield replace(job, checkpoint_dir=str(folder))
    finally:
        if not log_dir:
            shutil.rmtree(folder, ignore_errors=True)


def resume_job(job: Job, layout: ParallelLayout) -> Job:
    """The job that restores `job`'s checkpoint at `layout` and runs only the distckpt oracle there."""
    return replace(
        job,
        layout=layout,
        oracles=(ORACLE,),
        resuming=True,
        write_manifest=None,
        rank_function=None,
        rank_kwargs_file=None,
        workdir=".",
    )


def run_resumes(
    job: Job, result: dict[str, Any], log_dir: str | None = None, progress: ProgressSink | None = None
) -> dict[str, Any]:
    """Launch a resume job per `job.resume_layouts` after a good save; `result` with the distckpt verdicts folded."""
    saved_dict = next((o for o in result["oracles"] if o["name"] == ORACLE), None)
    if ORACLE not in job.oracles or not job.checkpoint_dir or saved_dict is None:
        return result
    saved = OracleVerdict.from_dict(saved_dict)
    resumed: list[OracleVerdict] = []
    problem = _unsaved(saved, Path(job.checkpoint_dir))
    if problem is None:
        for layout in job.resume_layouts:
            sub_log = str(Path(log_dir) / f"resume-{layout.spec}") if log_dir else None
            sub = run_ranks(resume_job(job, layout), log_dir=sub_log, progress=_prefixed(progress, layout))
            found = next((o for o in sub["oracles"] if o["name"] == ORACLE), None)
            resumed.append(OracleVerdict.from_dict(found) if found else _no_verdict(layout))
    merged = merge(saved, resumed, problem)
    return {**result, "oracles": [merged.to_dict() if o["name"] == ORACLE else o for o in result["oracles"]]}


def _unsaved(saved: OracleVerdict, folder: Path) -> Finding | None:
    """Why the resume jobs cannot run (the save failed or left no metadata), or None."""
    if any(f.kind == "save-failed" for f in saved.findings):
        return Finding(tensor="<checkpoint>", kind="not-resumed", message="the save failed, so nothing was resumed")
    if not (folder / "metadata.json").is_file():
        message = f"the save left no metadata.json in {folder}, so nothing was resumed"
        return Finding(tensor="<checkpoint>", kind="not-resumed", message=message)
    return None


def _no_verdict(layout: ParallelLayout) -> OracleVerdict:
    message = f"the resume job at {layout.label} returned no verdict"
    return OracleVerdict(
        name=ORACLE, checked=0, findings=(Finding(tensor="<distckpt>", kind="no-verdict", message=message),)
    )


def _prefixed(progress: ProgressSink | None, layout: ParallelLayout) -> ProgressSink | None:
    if progress is None:
        return None

    def sink(event: dict) -> None:
        progress({**event, "phase": f"resume job at {layout.label} (distckpt): {event.get('phase', '')}"})

    return sink


_RANK = {"pass": 0, "fail": 1, "missing": 2}


def merge(saved: OracleVerdict, resumed: list[OracleVerdict], problem: Finding | None = None) -> OracleVerdict:
    """One distckpt verdict from the save phase and every resume phase: findings, rows and measurements together."""
    findings = [*saved.findings, *(f for r in resumed for f in r.findings), *([problem] if problem else [])]
    rows: dict[str, TensorRow] = {}
    for row in (r for v in (saved, *resumed) for r in v.rows):
        held = rows.get(row.tensor)
        if held is None or _RANK.get(row.verdict, 1) > _RANK.get(held.verdict, 1):
            rows[row.tensor] = row
    metrics = dict(saved.metrics)
    for verdict in resumed:
        label = verdict.metrics.get("resumed_at", "?")
        suffix = "" if len(resumed) == 1 else f"@{label}"
        for key, value in verdict.metrics.items():
            if key != "resumed_at" and saved.metrics.get(key) != value:  # the same optimizer note is shown once
                metrics[f"{key}{suffix}"] = value
    metrics["resumed_at"] = ",".join(str(v.metrics.get("resumed_at", "?")) for v in resumed) or "none"
    checked = saved.checked + sum(v.checked for v in resumed) if resumed else 0
    return OracleVerdict(
        name=ORACLE,
        checked=checked,
        unit=saved.unit,
        findings=tuple(sorted(findings, key=lambda f: (f.tensor, f.kind, f.message))),
        rows=tuple(rows[n] for n in sorted(rows)),
        seconds=saved.seconds + sum(v.seconds for v in resumed),
        metrics=metrics,
    )
