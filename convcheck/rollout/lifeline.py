"""Child processes tied to their parent: one that dies with it, and a server that lives for a block (no torch: the
launcher, the ranks, both engine sides and the test session use them)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


@contextmanager
def server_for_block(command: list[str], socket_env: str, prefix: str, wait_s: float = 0.0,
                     env: Mapping[str, str] | None = None, cwd: str | None = None) -> Iterator[str]:  # fmt: skip
    """`command + [SOCKET]` started in a session of its own (its output in server.log beside the socket, in a fresh
    /tmp folder named `prefix`...: a short socket path), $`socket_env` set to SOCKET while the block runs (an existing
    one is kept: no server started), then stopped (SIGTERM, SIGKILL after 30 s) and its folder removed. Waits up to
    `wait_s` for the socket to appear."""
    if os.environ.get(socket_env):
        yield os.environ[socket_env]
        return
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path = str(folder / "socket")
    with open(folder / "server.log", "wb") as log:
        server = subprocess.Popen([*command, path], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True, env=None if env is None else dict(env), cwd=cwd)  # fmt: skip
    os.environ[socket_env] = path
    try:
        deadline = time.monotonic() + wait_s
        while not Path(path).exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        yield path
    finally:
        os.environ.pop(socket_env, None)
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)
