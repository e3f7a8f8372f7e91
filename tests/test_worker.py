"""The rank worker's exit path: children a rank leaves behind (e.g. a checkpoint save's multiprocessing workers) are
killed and reaped before `os._exit` skips their atexit cleanup."""

from __future__ import annotations

import subprocess
import sys

from convcheck.engine.worker import _child_pids, reap_children


def test_reap_children_kills_and_reaps_every_child() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        assert set(_child_pids()) >= {p.pid for p in procs}
        assert set(reap_children()) >= {p.pid for p in procs}
        assert not set(_child_pids()) & {p.pid for p in procs}
    finally:
        for p in procs:
            p.kill()
            try:
                p.wait(timeout=5)
            except (subprocess.TimeoutExpired, ChildProcessError):
                pass
