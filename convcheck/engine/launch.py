"""Launch the ranks of one job with torchrun, bounded in time, and turn what they leave into a result."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from convcheck.engine.job import Job
from convcheck.errors import BadInput, SetupError


def torchrun_command(job_file: Path, nproc: int) -> list[str]:
    """The torchrun command line for `nproc` ranks of the worker (free rendezvous port via --standalone)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "convcheck.engine.worker", str(job_file),
    ]  # fmt: skip


def rank_env(device: str) -> dict[str, str]:
    """Environment for the ranks: one thread each, unbuffered output, no GPU on CPU runs, NVLink multicast off."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if device == "cpu":
        # A CPU run on a GPU host hides the GPUs from its ranks: upstream code that asks "is CUDA available?" then
        # takes its CPU path, no rank creates a CUDA context, and nothing is allocated on (or blocks) the GPUs.
        env["CUDA_VISIBLE_DEVICES"] = ""
    if device == "cuda":
        env["NCCL_NVLS_ENABLE"] = "0"
        env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
        env["NVSHMEM_DISABLE_NVLS"] = "1"
    return env


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_ranks(job: Job, log_dir: str | None = None) -> dict[str, Any]:
    """Run `job` under torchrun; return rank 0's result dict, or raise BadInput / SetupError with one line."""
    workdir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="convcheck-"))
    workdir.mkdir(parents=True, exist_ok=True)
    job = replace(job, workdir=str(workdir))
    job_file = job.save()
    log_file = workdir / "ranks.log"
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            torchrun_command(job_file, job.layout.world_size),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=rank_env(job.device),
            start_new_session=True,
        )
        started = time.monotonic()
        try:
            code = proc.wait(timeout=job.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise SetupError(
                f"ranks did not finish within {job.timeout_s:g} s (a rank hung or died); "
                f"stopped all ranks; log: {log_file}"
            ) from None
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
    errors = _rank_errors(job)
    if code != 0 and not any(e["status"] == "bad_input" for e in errors):
        silent = sorted(set(range(job.layout.world_size)) - {e["rank"] for e in errors})
        if silent and errors:
            raise SetupError(
                f"rank {', '.join(map(str, silent))} died without reporting an error (torchrun exit code {code}); "
                f"the other ranks then failed with: {errors[0]['error'][:200]}; log: {log_file}"
            )
    if errors:
        first = errors[0]
        cls = BadInput if first["status"] == "bad_input" else SetupError
        where = "" if first["status"] == "bad_input" else f"rank {first['rank']} failed: "
        suffix = "" if first["status"] == "bad_input" else f" (log: {log_file})"
        raise cls(f"{where}{first['error']}{suffix}")
    if code != 0 or not job.result_file.exists():
        cause = root_cause(log_file)
        who = f"rank {cause[0]} died with exit code {cause[1]}" if cause else "a rank exited without a result"
        raise SetupError(f"{who} (torchrun exit code {code} after {time.monotonic() - started:.0f} s); log: {log_file}")
    return json.loads(job.result_file.read_text())


_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def root_cause(log_file: Path) -> tuple[int, int] | None:
    """(rank, exit code) of the first failure torchrun observed, read from its summary in the log."""
    try:
        match = _ROOT_CAUSE.search(log_file.read_text(errors="replace")[-20000:])
    except OSError:
        return None
    return (int(match.group(1)), int(match.group(2))) if match else None


def _rank_errors(job: Job) -> list[dict[str, Any]]:
    """Error files left by ranks, bad input first, then by rank."""
    out = []
    for rank in range(job.layout.world_size):
        path = job.error_file(rank)
        if path.exists():
            try:
                out.append(json.loads(path.read_text()))
            except json.JSONDecodeError:
                out.append({"status": "error", "rank": rank, "error": "unreadable error file"})
    return sorted(out, key=lambda e: (e["status"] != "bad_input", e["rank"]))
