"""The client's side of a warm engine server (convcheck.rollout.warm_engine): ask it for an engine process forked from
a state that imported torch, transformers and vLLM once, instead of starting and importing a fresh one (~20 s of a
tiny model's ~25 s engine start on 2 cores). Standard library only: the test session starts servers with it.

Opt-in, as the warm CPU ranks are: a rank 0 with `$CONVCHECK_ENGINE_WARM_SOCKET` asks the server there; a server
started from another interpreter, with another import-time environment or from source files changed since it
started refuses, and the client starts a fresh engine as without a server. The forked engine is the same host
program (`convcheck.rollout.host`) on the same pipes, so nothing after its start differs.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from convcheck.rollout.environment import engine_env, repo_root
from convcheck.rollout.lifeline import server_for_block

SOCKET_ENV = "CONVCHECK_ENGINE_WARM_SOCKET"
"""Where rank 0 finds a warm engine server (unset: every engine starts fresh)."""
IMPORT_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH", "PYTHONHASHSEED",
                "LD_LIBRARY_PATH", "LD_PRELOAD")  # fmt: skip
IMPORT_PREFIXES = ("VLLM_", "HF_", "TRANSFORMERS_")
"""Environment a library reads while it imports (device visibility, threads, the module path, vLLM's and the Hugging
Face libraries' own knobs): a server serves only clients whose engine environment has the same values (a fresh
engine reads them at import; a forked one inherited the server's). The rest (torchrun's variables, log levels, cache
folders) the fork takes from the client's environment, as a fresh engine would."""
CONNECT_TIMEOUT_S = 10.0
"""How long the client waits for the server to admit or refuse it before starting a fresh engine."""


def import_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The import-time part of an engine environment (IMPORT_NAMES and the names IMPORT_PREFIXES select)."""
    return {k: v for k, v in sorted(environ.items()) if k in IMPORT_NAMES or k.startswith(IMPORT_PREFIXES)}


def send_line(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """One JSON line on `sock`, with `fds` passed along (SCM_RIGHTS) when given."""
    data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


class LineReader:
    """JSON lines read from a socket, with a timeout per line; None at the end of the stream."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def read(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The next line; TimeoutError when none comes within `timeout_s`; None once the peer closed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], wait)[0]:
                raise TimeoutError
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)


class WarmProcess:
    """An engine process forked by a warm server, with what the client uses of `subprocess.Popen`: `pid` (also its
    session's id), `stdin` / `stdout` (the client's ends of its pipes), `poll()` and `wait()` (its exit status, as
    Popen's `returncode`: negative for a signal, reported by the server that reaps it)."""

    def __init__(self, sock: socket.socket, lines: LineReader, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.sock = sock
        self.lines = lines
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self.args = ["warm engine", str(pid)]

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; subprocess.TimeoutExpired when the process has not ended within `timeout` seconds."""
        if self.returncode is not None:
            return self.returncode
        try:
            message = self.lines.read(timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
        # the server reports each exit; a server gone without a report leaves the process's fate unknown: its
        # session is then stopped by the caller like any other
        self.returncode = int(message["exit"]) if message and "exit" in message else -signal.SIGKILL
        self.sock.close()
        return self.returncode


def start_warm(python: str, log: IO[bytes], environ: Mapping[str, str] = os.environ) -> WarmProcess | None:
    """An engine process forked by the warm server at $CONVCHECK_ENGINE_WARM_SOCKET for the interpreter `python`,
    its stderr on `log`; None when there is no server, it refuses, or it does not answer (start a fresh one)."""
    path = environ.get(SOCKET_ENV, "")
    if not path or not Path(path).exists():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    child_in, ours_in = os.pipe()
    ours_out, child_out = os.pipe()
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(path)
        sock.settimeout(None)
        env = engine_env()
        send_line(sock, {"python": python, "import_env": import_env(env), "env": env, "client": os.getpid()},
                  [child_in, child_out, log.fileno()])  # fmt: skip
        lines = LineReader(sock)
        answer = lines.read(CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError):
        answer = None
    finally:
        os.close(child_in)
        os.close(child_out)
    if not answer or "pid" not in answer:
        why = (answer or {}).get("refused") or "no answer"
        log.write(f"convcheck: the warm engine server at {path} did not start this engine ({why}); starting a fresh "
                  f"one\n".encode())  # fmt: skip
        log.flush()
        sock.close()
        os.close(ours_in)
        os.close(ours_out)
        return None
    return WarmProcess(sock, lines, int(answer["pid"]), os.fdopen(ours_in, "wb"), os.fdopen(ours_out, "rb"))


@contextmanager
def serving_engine(python: str, ranks_env: Mapping[str, str] | None = None,
                   wait_s: float = 0.0) -> Iterator[str | None]:  # fmt: skip
    """A warm engine server for `python` (an interpreter with vLLM) while the block runs, $CONVCHECK_ENGINE_WARM_SOCKET
    set for this process and its children (an existing one is kept), stopped and its folder removed after.
    `ranks_env` is the environment of the ranks whose engines it serves (default: this process's; CPU ranks, for one,
    hide the GPUs: convcheck.engine.launch.rank_env): it serves only engines whose import-time environment equals
    its own. Waits up to `wait_s` for it to be ready; engines started before that start fresh. Yields None when
    `python` is absent."""
    if not os.environ.get(SOCKET_ENV) and not Path(python).is_file():
        yield None
        return
    command = [python, "-m", "convcheck.rollout.warm_engine"]
    prefix = f"convcheck-tmp-{os.getpid()}-engine"
    with server_for_block(command, SOCKET_ENV, prefix, wait_s, env=engine_env(ranks_env), cwd=str(repo_root())) as path:
        yield path
