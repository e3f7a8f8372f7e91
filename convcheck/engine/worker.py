"""Entry point of one rank under torchrun: bring the rank up, run the oracles, write the result."""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from convcheck.atomic import write_bytes_atomic, write_json_atomic
from convcheck.engine.job import Job
from convcheck.engine.launch import die_with_parent
from convcheck.engine.recorder import ManifestRecorder
from convcheck.errors import BadInput, BuildFailed, one_line
from convcheck.hooks import load_hook
from convcheck.oracles import close_early, load_oracle, riders, start_early
from convcheck.rank import shard_match
from convcheck.rank.bringup import bring_up, quiet
from convcheck.rank.context import RankContext
from convcheck.rank.dist import shutdown_distributed
from convcheck.rank.lone import LoneFailure
from convcheck.rank.memory import AnonPeak, memory_mb, reset_peak, trim
from convcheck.verdict import Finding, OracleVerdict
from convcheck.versions import versions


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
    riding = riders(job.oracles)  # what the oracles declare they do inside an earlier oracle's drain
    ctx.memo.probe_in_export = "differential" in riding
    ctx.memo.shard_tap = shard_match.start(ctx) if "mapping" in riding else None
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
    import pickle

    kwargs = pickle.loads(Path(job.rank_kwargs_file).read_bytes()) if job.rank_kwargs_file else {}
    value = function(ctx, **kwargs)
    if ctx.rank != 0:
        return None
    write_bytes_atomic(job.value_file, pickle.dumps(value))
    return {"status": "ok", "versions": versions(), "oracles": [], "seconds": round(time.perf_counter() - started, 3)}


def main(argv: list[str] | None = None) -> int:
    """torchrun target: `python -m convcheck.engine.worker JOB.json`."""
    die_with_parent()  # torchrun killed -> this rank too
    if os.getppid() == 1:  # torchrun died before the line above
        return 5
    argv = sys.argv[1:] if argv is None else argv
    quiet()
    job = Job.load(argv[0])
    rank = int(os.environ.get("RANK", "0"))
    lone = False
    try:
        result = run_job(job)
        if result is not None:
            write_json_atomic(job.result_file, result)
    except BadInput as exc:
        write_json_atomic(job.error_file(rank), {"status": "bad_input", "rank": rank, "error": str(exc)})
        return 3
    except LoneFailure as exc:  # the peers wait in a collective of the bridge's: the launcher ends the run now
        write_json_atomic(job.error_file(rank), {"status": "lone", "rank": rank, "error": str(exc),
                                                 "stage": exc.stage, "oracle": exc.oracle})  # fmt: skip
        lone = True  # no teardown: a group whose peers sit in a collective is not to be waited for
        return 4
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line for the launcher
        write_json_atomic(
            job.error_file(rank),
            {"status": "error", "rank": rank, "error": one_line(exc), "traceback": traceback.format_exc()},
        )
        traceback.print_exc()
        return 4
    finally:
        try:
            if not lone:
                shutdown_distributed()
        except Exception:  # noqa: BLE001 - teardown after a failure must not mask it
            pass
    return 0


def reap_children() -> list[int]:
    """SIGKILL and reap every child process this rank still has (e.g. multiprocessing workers a checkpoint save
    started, whose atexit cleanup `os._exit` skips); return their pids."""
    import signal

    pids = _child_pids()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    return pids


def _child_pids() -> list[int]:
    """Pids whose parent is this process."""
    import psutil

    return [child.pid for child in psutil.Process().children(recursive=False)]


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    reap_children()  # os._exit skips multiprocessing's atexit, which would have stopped them
    os._exit(exit_code)  # results are on disk and the process group is gone: skip ~2 s of interpreter teardown
