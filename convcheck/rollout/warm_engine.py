"""A warm engine server: imports torch, transformers and vLLM once in the engine's interpreter, then forks one engine
host (`convcheck.rollout.host`) per client on the pipes the client passes (convcheck.rollout.warm_link).

`python -m convcheck.rollout.warm_engine SOCKET`, started with the engine's environment (`engine_env()`) from the
repository root. Each request carries three file descriptors (the host's stdin, stdout and log) and the client's
engine environment; the server admits it only when the client asked for this very interpreter, its import-time
environment equals the server's, and no source file the server loaded changed since (else it refuses and the client
starts a fresh engine). The fork runs in a session of its own with the client's full environment, is killed when
the client's process is gone (as a fresh engine's PR_SET_PDEATHSIG does), and its exit status goes back to the
client on the connection once the server reaps it.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from convcheck.cache import changed_since, source_snapshot
from convcheck.rollout.lifeline import die_with_parent
from convcheck.rollout.warm_link import LineReader, import_env, send_line

WATCHED = ("convcheck", "vllm", "transformers", "torch")
"""The loaded source files whose change makes the server refuse (its forks would run the old code)."""
CLIENT_POLL_S = 0.5
"""How often a forked engine checks that its client is still alive."""


def preload() -> None:
    """What every engine host imports before its first request: torch, transformers, vLLM and its engine classes."""
    importlib.import_module("convcheck.rollout.host")
    vllm = importlib.import_module("vllm")
    vllm.LLM, vllm.SamplingParams  # noqa: B018 - vLLM's lazy attributes import the engine on first touch


def serve(path: str) -> int:
    """Listen on the Unix socket `path` until SIGTERM/SIGINT; fork one engine host per admitted request."""
    die_with_parent()
    env = import_env(os.environ)  # as started: importing vLLM sets some of its own
    preload()
    loaded = source_snapshot(WATCHED)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    Path(path).unlink(missing_ok=True)
    listener.bind(path)
    listener.listen(16)
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    print(f"convcheck warm engine server ready on {path} (pid {os.getpid()})", flush=True)
    clients: dict[int, socket.socket] = {}
    try:
        while not stopping:
            _report_exits(clients)
            if not select.select([listener], [], [], 0.2)[0]:
                continue
            conn, _ = listener.accept()
            _admit(conn, env, loaded, clients, listener)
    finally:
        listener.close()
        Path(path).unlink(missing_ok=True)
        for pid in clients:
            _kill_session(pid)
    return 0


def _admit(conn: socket.socket, env: dict[str, str], loaded: dict[str, tuple[int, int, str]],
           clients: dict[int, socket.socket], listener: socket.socket) -> None:  # fmt: skip
    """Read one request with its descriptors; fork its engine host (holding none of the server's sockets) or refuse
    it."""
    fds: list[int] = []
    try:
        conn.settimeout(10)
        data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
        conn.settimeout(None)
        reader = LineReader(conn)
        reader.buffer = data
        request = reader.read(10) or {}
        refusal = admission(request, env, sys.executable, len(fds)) or changed_since(loaded)
        if refusal:
            send_line(conn, {"refused": refusal})
            conn.close()
            return
        pid = os.fork()
        if pid == 0:  # the engine host: never returns
            client = peer_pid(conn) or int(request["client"])
            for held in (listener, conn, *clients.values()):
                held.close()
            _host(fds, request, client)
        clients[pid] = conn
        send_line(conn, {"pid": pid})
    except (OSError, TimeoutError, ValueError):
        conn.close()
    finally:
        for fd in fds:
            os.close(fd)


def admission(request: dict[str, Any], env: dict[str, str], python: str, descriptors: int) -> str | None:
    """Why this server cannot start the engine `request` asks for as a fresh process would (None: it can)."""
    if descriptors != 3:
        return "the request did not pass the engine's stdin, stdout and log"
    if request.get("python") != python:
        return f"the client asked for the interpreter {request.get('python')}, the server runs {python}"
    if request.get("import_env") != env:
        return "the client's import-time engine environment differs from the server's"
    return None


def peer_pid(conn: socket.socket) -> int | None:
    """The process id of the client at the other end of `conn` (Linux SO_PEERCRED; None elsewhere)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return pid


def _host(fds: list[int], request: dict[str, Any], client: int) -> None:
    """In the fork: a session of its own, the client's pipes as stdin / stdout and its log as stderr, the client's
    engine environment; serve requests as a fresh host would; exit."""
    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.environ.clear()
        os.environ.update(request["env"])
        threading.Thread(target=_die_with_client, args=(client,), daemon=True).start()
        host = importlib.import_module("convcheck.rollout.host")
        code = host.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the client sees the closed pipe; the log says why
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _die_with_client(client: int) -> None:
    """Kill this engine's whole session once the client's process is gone."""
    while True:
        time.sleep(CLIENT_POLL_S)
        try:
            os.kill(client, 0)
        except ProcessLookupError:
            os.killpg(0, signal.SIGKILL)
        except PermissionError:
            continue


def _report_exits(clients: dict[int, socket.socket]) -> None:
    """Reap ended engine hosts and send each one's exit status (Popen's returncode) to its client."""
    while clients:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = clients.pop(pid, None)
        if conn is None:
            continue
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        try:
            send_line(conn, {"exit": code})
        except OSError:
            pass
        conn.close()


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
