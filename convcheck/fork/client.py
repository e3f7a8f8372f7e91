"""The client side of a warm server (`convcheck.engine.warm`): ask it to fork a job's ranks or one child process, wait
for their exit codes within a time limit, stop them on a timeout or a signal. Imports no heavy library (it runs in the
launcher); `convcheck.engine.warm_client.serving` starts a server for a block of code."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

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


def run_module(
    path: str,
    module: str,
    argv: list[str],
    *,
    env: Mapping[str, str],
    out_file: str,
    err_file: str,
    timeout_s: float,
    cwd: str = ".",
) -> int | None:
    """Run `python -m MODULE ARGV...` as one process forked by the warm server at `path` (its stdout to `out_file`,
    its stderr to `err_file`); its exit code, or None when the server cannot take it (the caller then starts a fresh
    interpreter). WarmTimeout after `timeout_s`."""
    request = {"module": module, "argv": list(argv), "nproc": 1, "env": dict(env), "log_file": out_file,
               "err_file": err_file, "cwd": cwd}  # fmt: skip
    exits = run_warm(path, request, timeout_s, lambda: None)
    return None if exits is None else exits[0][1]


def child_output(module: str, argv: list[str], timeout_s: float) -> tuple[int, str, str] | None:
    """(exit code, stdout, stderr) of `python -m MODULE ARGV...` forked by the warm server of $CONVCHECK_WARM_SOCKET
    (torch, megatron and transformers already imported), with this process's environment and working folder; None
    when there is none or it refuses (another convcheck source, another import-time environment): the caller then
    starts a fresh interpreter. WarmTimeout after `timeout_s` (the child is stopped)."""
    socket_path = warm_socket("cpu")
    if socket_path is None:
        return None
    env = dict(os.environ)  # with what the server set for itself before it loaded torch: the child uses the CPU
    env.setdefault("OMP_NUM_THREADS", "1")
    env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory(prefix="convcheck-child-") as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        code = run_module(socket_path, module, argv, env=env, out_file=str(out), err_file=str(err),
                          timeout_s=timeout_s, cwd=os.getcwd())  # fmt: skip
        if code is None:
            return None
        return code, *(p.read_text(errors="replace") if p.exists() else "" for p in (out, err))


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
