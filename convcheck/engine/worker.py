"""Entry point of one rank under torchrun: load the rank's work (convcheck.engine.rank_run, which imports the stack),
run it, write the result; any failure, an import that fails included, becomes one line in the rank's error file."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

from convcheck.atomic import write_json_atomic
from convcheck.engine.job import Job
from convcheck.errors import BadInput, LoneFailure, one_line
from convcheck.rollout.lifeline import die_with_parent


def main(argv: list[str] | None = None) -> int:
    """torchrun target: `python -m convcheck.engine.worker JOB.json`."""
    die_with_parent()  # torchrun killed -> this rank too
    if os.getppid() == 1:  # torchrun died before the line above
        return 5
    argv = sys.argv[1:] if argv is None else argv
    job = Job.load(argv[0])
    rank = int(os.environ.get("RANK", "0"))
    lone = False
    runner: Any = None
    try:
        runner = importlib.import_module("convcheck.engine.rank_run")  # the stack: an import that fails is a failure
        runner.quiet()
        result = runner.run_job(job)
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
            if not lone and runner is not None:
                runner.shutdown_distributed()
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
