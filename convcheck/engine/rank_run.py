"""One rank's work under torchrun or a warm server: bring the rank up, run the oracles (or the job's rank function),
return rank 0's result. convcheck.engine.worker imports it inside its error handling, so a stack that fails to import
is reported like any rank failure."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

from convcheck.atomic import write_bytes_atomic, write_json_atomic
from convcheck.engine.job import Job
from convcheck.engine.recorder import ManifestRecorder
from convcheck.errors import BuildFailed, LoneFailure
from convcheck.hooks import load_hook
from convcheck.oracles import close_early, load_oracle, ride, start_early
from convcheck.rank.bringup import bring_up
from convcheck.rank.context import RankContext
from convcheck.rank.dist import shutdown_distributed
from convcheck.rank.memory import AnonPeak, memory_mb, reset_peak, trim
from convcheck.rank.quiet import quiet
from convcheck.verdict import Finding, OracleVerdict
from convcheck.versions import versions

__all__ = ["quiet", "run_job", "shutdown_distributed"]


def run_job(job: Job) -> dict[str, Any] | None:
    """Run every selected oracle (or the job's rank function) on this rank; the result dict on rank 0, else None."""
    first = int(os.environ.get("RANK", "0")) == 0
    early = start_early(job.oracles, job.options, job.rank_spec()) if first and not job.rank_function else {}
    try:
        return _run_job(job, early)
    finally:
        close_early(early)


def _run_job(job: Job, early: dict[str, Any]) -> dict[str, Any] | None:
    started = time.perf_counter()
    anon = AnonPeak()
    oracles = [load_oracle(name) for name in job.oracles]
    hooks = tuple(load_hook(h) for h in job.hooks)
    function = load_hook(job.rank_function, what="rank function") if job.rank_function else None
    try:
        ctx = bring_up(job.rank_spec(), hooks, load=not job.resuming)
    except BuildFailed as exc:
        return build_failed(job, exc, started) if int(os.environ.get("RANK", "0")) == 0 else None
    ctx.early = early
    if function is not None:
        return _run_function(job, ctx, function, started)
    recorder = None
    if job.manifest_out:
        recorder = ManifestRecorder.start(ctx)  # taps the export stream the oracles drain anyway
    ride(ctx, job.oracles)  # what the oracles declare they do inside an earlier oracle's drain
    verdicts = []
    memory, anon_peaks = {"bring_up": peak_mb()}, {"bring_up": anon.take()}
    for name, oracle in zip(job.oracles, oracles, strict=True):
        ctx.phase = f"oracle {name}"
        ctx.progress.emit(ctx.phase)
        t0 = time.perf_counter()
        try:
            verdict = oracle(ctx)
        except LoneFailure as exc:
            exc.oracle = name
            raise
        if verdict is not None:
            verdicts.append({**verdict.to_dict(), "seconds": round(time.perf_counter() - t0, 3)})
            write_json_atomic(job.partial_file, {"versions": {**versions(), **ctx.versions}, "oracles": verdicts})
        memory[name], anon_peaks[name] = peak_mb(), anon.take()
    manifest = recorder.finish(job) if recorder is not None else None
    if ctx.rank != 0:
        return None
    return {
        **({"manifest": manifest} if manifest is not None else {}),
        "status": "ok",
        "versions": {**versions(), **ctx.versions},
        "oracles": verdicts,
        "seconds": round(time.perf_counter() - started, 3),
        "rank0_peak_MB": memory,
        "rank0_anon_peak_MB": anon_peaks,
    }


def build_failed(job: Job, exc: BuildFailed, started: float) -> dict[str, Any]:
    """Rank 0's result when the bridge could not build the model: every selected oracle fails on one finding."""
    finding = Finding(
        tensor="<build>", kind="build-failed", message=f"the bridge's provider or model build raised {exc}"
    )
    verdicts = [OracleVerdict(name=name, checked=0, findings=(finding,)).to_dict() for name in job.oracles]
    return {
        "status": "ok",
        "versions": versions(),
        "oracles": verdicts,
        "seconds": round(time.perf_counter() - started, 3),
    }


def peak_mb() -> float:
    """This process's RSS high-water mark since the last call, in MB (-1 where unknown); starts a new one after
    handing the phase's freed heap back."""
    peak = memory_mb().get("VmHWM", -1.0)
    trim()
    reset_peak()
    return peak


def _run_function(job: Job, ctx: RankContext, function: Any, started: float) -> dict[str, Any] | None:
    """Call the job's rank function collectively; rank 0 pickles what it returned."""
    kwargs = pickle.loads(Path(job.rank_kwargs_file).read_bytes()) if job.rank_kwargs_file else {}
    value = function(ctx, **kwargs)
    if ctx.rank != 0:
        return None
    write_bytes_atomic(job.value_file, pickle.dumps(value))
    return {"status": "ok", "versions": versions(), "oracles": [], "seconds": round(time.perf_counter() - started, 3)}
