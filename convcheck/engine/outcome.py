"""What the ranks of one launch left behind, read into rank 0's result or the one error that explains its absence."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

from convcheck.engine.job import Job
from convcheck.errors import BadInput, SetupError
from convcheck.versions import versions


def read_result(
    job: Job,
    code: int,
    log_file: Path,
    started: float,
    exits: list[tuple[int, int]] | None = None,
    launcher: str = "torchrun",
    local: range | None = None,
) -> dict[str, Any] | None:
    """Rank 0's result, or the error that explains its absence. `exits`: (rank, exit code) in the order the ranks
    ended, as the warm agent reports them (None: read torchrun's summary in the log). `local`: the ranks this node
    started when the job spans nodes (None when rank 0 is not among them and all ended well)."""
    local = range(job.layout.world_size) if local is None else local
    failed = exit_codes(log_file) if exits is None else {rank: c for rank, c in exits if c != 0}
    errors = _rank_errors(job, local)
    lone = next((e for e in errors if e["status"] == "lone"), None)
    if lone is not None:
        return stopped_result(job, lone, time.monotonic() - started)
    if code != 0 and not any(e["status"] == "bad_input" for e in errors):
        stopped = {rank for rank, exit_code in failed.items() if exit_code == -signal.SIGTERM}
        silent = sorted(set(local) - {e["rank"] for e in errors} - stopped)
        if silent and errors:
            raise SetupError(
                f"rank {', '.join(map(str, silent))} died without reporting an error ({launcher} exit code {code}); "
                f"the other ranks then failed with: {errors[0]['error'][:200]}; log: {log_file}"
            )
    if errors:
        first = errors[0]
        if first["status"] == "bad_input":
            raise BadInput(first["error"])
        raise SetupError(f"rank {first['rank']} failed: {first['error']} (log: {log_file})")
    if code == 0 and 0 not in local:
        return None
    if code != 0 or not job.result_file.exists():
        cause = root_cause(log_file) if exits is None else next(((r, c) for r, c in exits if c != 0), None)
        who = f"rank {cause[0]} died with exit code {cause[1]}" if cause else "a rank exited without a result"
        raise SetupError(
            f"{who} ({launcher} exit code {code} after {time.monotonic() - started:.0f} s); log: {log_file}"
        )
    return json.loads(job.result_file.read_text())


_EXIT = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^)]*\)\s*exitcode\s*:\s*(-?\d+)")


def exit_codes(log_file: Path) -> dict[int, int]:
    """Rank -> exit code of every failed rank in torchrun's summary (-15: torchrun stopped it after another failed)."""
    try:
        text = log_file.read_text(errors="replace")[-20000:]
    except OSError:
        return {}
    return {int(rank): int(code) for rank, code in _EXIT.findall(text)}


_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def root_cause(log_file: Path) -> tuple[int, int] | None:
    """(rank, exit code) of the first failure torchrun observed, read from its summary in the log."""
    try:
        match = _ROOT_CAUSE.search(log_file.read_text(errors="replace")[-20000:])
    except OSError:
        return None
    return (int(match.group(1)), int(match.group(2))) if match else None


def _rank_errors(job: Job, ranks: range) -> list[dict[str, Any]]:
    """Error files left by `ranks`: bad input first, then the earliest written (the cause; its peers' errors follow)."""
    out = []
    for rank in ranks:
        path = job.error_file(rank)
        if path.exists():
            try:
                error = json.loads(path.read_text())
            except json.JSONDecodeError:
                error = {"status": "error", "rank": rank, "error": "unreadable error file"}
            out.append((error["status"] != "bad_input", path.stat().st_mtime_ns, rank, error))
    return [error for *_, error in sorted(out, key=lambda item: item[:3])]


def stopped_result(job: Job, lone: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Rank 0's result for a run a bridge stage raising on some ranks only stopped (convcheck.rank.lone): the
    verdicts rank 0 finished before it, then every oracle it stopped failing on the one finding that names it."""
    try:
        partial = json.loads(job.partial_file.read_text())
    except (OSError, json.JSONDecodeError):
        partial = {"versions": versions(), "oracles": []}
    done = [v for v in partial["oracles"] if v["name"] != lone["oracle"]]
    stage = lone["stage"]
    finding = {"tensor": f"<{stage}>", "kind": f"{stage}-failed", "message": lone["error"],
               "detail": {"rank": lone["rank"], "stopped_run": True}}  # fmt: skip
    finished = {v["name"] for v in done}
    stopped = [{"name": n, "checked": 0, "findings": [finding]} for n in job.oracles if n not in finished]
    return {"status": "ok", "versions": partial["versions"], "oracles": done + stopped, "seconds": round(seconds, 3)}
