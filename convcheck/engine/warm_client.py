"""The launcher's side of warm CPU ranks (`convcheck.engine.warm`): ask the server named by `CONVCHECK_WARM_SOCKET` to
run a job's ranks, wait for their exit codes within the job's time limit, stop them on a timeout or a signal. Imports
no heavy library (it runs in the launcher)."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from convcheck.rollout.lifeline import server_for_block

SOCKET_ENV = "CONVCHECK_WARM_SOCKET"
IMPORT_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "PYTHONHASHSEED")
"""Environment read while the heavy libraries import: a warm server serves only launchers whose ranks would see the
same values (a fresh rank reads them at import time; a forked one inherited the server's)."""
UPSTREAM = ("torch", "megatron-core", "megatron-bridge", "transformers", "safetensors")
STOP_GRACE_S = 5.0
PIDS_FILE = "warm-pids.json"
"""Written by the agent next to the job's rank log: {"agent": pid, "ranks": [pid of rank 0, ...]}."""


class WarmTimeout(Exception):
    """The ranks did not finish within the job's time limit (they are stopped)."""


def import_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The import-time part of `environ` (absent names as "")."""
    return {name: environ.get(name, "") for name in IMPORT_ENV}


def source_key() -> str:
    """sha256 of this interpreter, the installed upstream versions and every convcheck source file's path and bytes:
    a server started from other code (or another venv) has another key and is not used."""
    digest = hashlib.sha256(sys.executable.encode())
    for dist in UPSTREAM:
        try:
            digest.update(f"\0{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"\0{dist}=absent".encode())
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(b"\0" + str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def warm_socket(device: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The warm server to use for a job on `device` (only CPU jobs; None: launch with torchrun)."""
    path = environ.get(SOCKET_ENV, "")
    return path if path and device == "cpu" and Path(path).exists() else None


def run_warm(
    path: str,
    request: dict[str, Any],
    timeout_s: float,
    poll: Callable[[], None],
) -> list[tuple[int, int]] | None:
    """Run the job of `request` (job_file, nproc, env, log_file, cwd) on the warm server at `path`.

    Returns (rank, exit code) in the order the ranks exited, or None when the server is unreachable or refuses
    (the caller then uses torchrun). Raises WarmTimeout after `timeout_s`; on any exception (SIGINT, SIGTERM) the
    ranks are stopped before it propagates. `poll` is called about every 0.25 s (progress events).
    """
    message = {**request, "key": source_key(), "import_env": import_env(request["env"])}
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        conn.sendall(json.dumps(message).encode() + b"\n")
        lines = _Lines(conn)
        first = lines.next(timeout_s=30.0)
    except OSError:
        return None
    if first is None or "refused" in first:
        conn.close()
        return None
    agent = int(first["pid"])
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            poll()
            done = lines.next(timeout_s=min(0.25, max(0.0, deadline - time.monotonic())))
            if done is not None:
                return [(int(rank), int(code)) for rank, code in done["exits"]]
            if lines.closed:
                raise RuntimeError(f"the warm agent (pid {agent}) ended without reporting its ranks")
            if time.monotonic() >= deadline:
                raise WarmTimeout
    except BaseException:
        _stop(agent, lines)
        raise
    finally:
        poll()
        conn.close()


def run_script(
    path: str,
    script: str,
    argv: list[str],
    *,
    nproc: int,
    env: Mapping[str, str],
    log_file: str,
    timeout_s: float,
    cwd: str = ".",
) -> list[tuple[int, int]] | None:
    """Fork `nproc` ranks on the warm server at `path` that each run `script ARGV...` as `__main__` (as torchrun runs
    a trainer, with its RANK, WORLD_SIZE, MASTER_ADDR...), output to `log_file`; (rank, exit code) in exit order, or
    None when the server cannot take it (the caller then uses torchrun). WarmTimeout after `timeout_s`."""
    request = {"script": script, "argv": list(argv), "nproc": nproc, "env": dict(env), "log_file": log_file,
               "cwd": cwd}  # fmt: skip
    return run_warm(path, request, timeout_s, lambda: None)


def _stop(agent: int, lines: "_Lines") -> None:
    """SIGTERM the agent's session (agent and ranks), SIGKILL what is left once the grace is over."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(agent, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + grace
        while not lines.closed and time.monotonic() < end:
            lines.next(timeout_s=0.1)
    try:
        os.killpg(agent, signal.SIGKILL)  # the agent is gone: no rank of its session outlives it
    except ProcessLookupError:
        pass


class _Lines:
    """JSON lines read from a socket, with a timeout per call."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer, self.closed = conn, b"", False

    def next(self, timeout_s: float) -> dict[str, Any] | None:
        """The next complete message, or None if none arrived within `timeout_s` (or the peer closed)."""
        end = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            if self.closed:
                return None
            left = end - time.monotonic()
            if left < 0 or not select.select([self.conn], [], [], max(0.0, left))[0]:
                return None
            chunk = self.conn.recv(65536)
            if not chunk:
                self.closed = True
                continue
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


SERVER_PREFIX = "convcheck-tmp-"
"""A server's folder is /tmp/convcheck-tmp-<pid of its launcher>-warm*: swept as the ranks' short TMPDIRs are
(`convcheck.engine.launch.sweep_orphans`) once that launcher is gone."""


@contextmanager
def serving(wait_s: float = 0.0) -> Iterator[str]:
    """A warm server for this process's CPU launches while the block runs ($CONVCHECK_WARM_SOCKET set; an existing
    one is kept), stopped and its folder removed after. Waits up to `wait_s` for it to be ready; launches before
    that use torchrun."""
    command = [sys.executable, "-m", "convcheck.engine.warm"]
    with server_for_block(command, SOCKET_ENV, f"{SERVER_PREFIX}{os.getpid()}-warm", wait_s) as path:
        yield path
