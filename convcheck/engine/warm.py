"""Warm CPU ranks: a server that imports megatron-core, megatron-bridge and transformers once, then forks the ranks of
each job from that state instead of starting torchrun and importing them again in every rank (~18 s per launch on 2
cores, ~90% of a tiny fixture's run).

Opt-in: `python -m convcheck.engine.warm SOCKET` starts a server; a launcher with `CONVCHECK_WARM_SOCKET=SOCKET` in
its environment sends it its CPU jobs: a job file for the worker, a script its ranks run as `__main__` as torchrun
runs a trainer (`fork.client.run_script`), or a module one process runs as `python -m` would (the fixture builds of
`convcheck.fixtures.folders`, `fork.client.run_module`). Each job gets a fresh fork of the server (the server itself
never runs one), so no job sees another's state; the server answers only launchers whose convcheck source and
import-time environment equal its own (`source_key`, `IMPORT_ENV`), others fall back to torchrun or a fresh
interpreter. Per job an agent process (its own session, like torchrun) forks one process per rank with torchrun's
environment (RANK, WORLD_SIZE, MASTER_PORT...), stops the others when a rank fails, and reports every rank's exit code
to the launcher over the socket. The launcher side of the protocol is `convcheck.fork.client`.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from convcheck.atomic import write_json_atomic
from convcheck.cache import changed_since, source_snapshot
from convcheck.engine.worker import main, reap_children
from convcheck.fork.client import IMPORT_ENV, PIDS_FILE, import_env, source_key
from convcheck.rank.quiet import quiet
from convcheck.rollout.lifeline import die_with_parent

STOP_GRACE_S = 5.0
"""How long the other ranks get after one failed (SIGTERM) before SIGKILL, as torchrun."""


def serve(path: str) -> int:
    """Listen on the Unix socket `path` until SIGTERM/SIGINT; fork one agent per job request."""
    die_with_parent()
    quiet()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what a CPU rank gets (launch.rank_env), set before torch loads
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    key, env = source_key(), import_env(os.environ)
    importlib.import_module("convcheck.engine.warm_preload").preload()  # torch loads now, after the lines above
    loaded = source_snapshot()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    Path(path).unlink(missing_ok=True)
    listener.bind(path)
    listener.listen(64)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    print(f"convcheck warm server ready on {path} (pid {os.getpid()})", flush=True)
    try:
        while not stopping:
            _reap()
            if not select.select([listener], [], [], 0.5)[0]:
                continue
            conn, _ = listener.accept()
            with conn:
                request = _read_message(conn)
                refusal, extras = _admission(request, key, env)
                refusal = refusal or changed_since(loaded)
                if refusal:
                    _send(conn, {"refused": refusal})
                    continue
                request["extra_paths"] = extras
                if os.fork() == 0:  # the agent: never returns
                    listener.close()
                    _agent(conn, request)
    finally:
        listener.close()
        Path(path).unlink(missing_ok=True)
    return 0


def _admission(request: dict[str, Any] | None, key: str, env: dict[str, str]) -> tuple[str | None, list[str]]:
    """(why this server cannot run `request` as a fresh torchrun would, or None; the PYTHONPATH entries its ranks
    put before the server's)."""
    if request is None:
        return "no request", []
    if request.get("key") != key:
        return "the convcheck source changed since the server started", []
    asked = dict(request.get("import_env") or {})
    if {**asked, "PYTHONPATH": ""} != {**env, "PYTHONPATH": ""}:
        names = ", ".join(IMPORT_ENV)
        return f"the launcher's import-time environment ({names}) differs from the server's", []
    extras = extra_paths(asked.get("PYTHONPATH", ""), env["PYTHONPATH"], request.get("cwd", "."))
    if extras is None:
        return "the launcher's PYTHONPATH does not end with the server's", []
    shadow = shadowing(extras, imported_from())
    if shadow:
        return f"the launcher's PYTHONPATH holds {shadow}, a module the server imported from elsewhere", []
    return None, extras


def extra_paths(asked: str, own: str, cwd: str) -> list[str] | None:
    """The absolute PYTHONPATH entries a job puts before the server's own (None: its PYTHONPATH does not end with
    the server's, so a fresh rank would search another order)."""
    entries = [e for e in asked.split(os.pathsep) if e]
    tail = [e for e in own.split(os.pathsep) if e]
    if entries[len(entries) - len(tail) :] != tail:
        return None
    return [os.path.abspath(os.path.join(cwd, e)) for e in entries[: len(entries) - len(tail)]]


def imported_from() -> dict[str, set[Path]]:
    """Top-level module name -> where this process imported it from (a package's folders, a module's file; empty for
    a built-in or frozen one)."""
    out: dict[str, set[Path]] = {}
    for name, module in list(sys.modules.items()):
        if "." in name:
            continue
        paths = list(getattr(module, "__path__", None) or [])
        file = getattr(module, "__file__", None)
        if not paths and file:
            paths = [file]
        out[name] = {Path(p).resolve() for p in paths}
    return out


def shadowing(paths: list[str], imported: dict[str, set[Path]]) -> str | None:
    """The first file or folder under `paths` a fresh interpreter would import in place of a top-level module the
    server already has from elsewhere (or run at start-up: sitecustomize, usercustomize; a zip on the path counts as
    one); None: the forked ranks resolve every import as fresh ones would, with `paths` put before the server's. The
    very package or file the server imported (a checkout's own folder on the path) shadows nothing."""
    for entry in map(Path, paths):
        if not entry.is_dir():
            if entry.exists():
                return str(entry)
            continue
        for child in entry.iterdir():
            name = child.name if child.is_dir() else child.name.split(".")[0]
            if name in ("sitecustomize", "usercustomize"):
                return str(child)
            if name in imported and child.resolve() not in imported[name]:
                return str(child)
    return None


def _reap() -> None:
    """Collect finished agents (the server's only children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _agent(conn: socket.socket, request: dict[str, Any]) -> None:
    """Run one job's ranks in a session of their own; report their exit codes on `conn`; exit."""
    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        _send(conn, {"pid": os.getpid()})
        _send(conn, {"exits": _run_ranks(conn, request)})
        code = 0
    except BaseException:  # noqa: BLE001 - the launcher sees the closed socket and names the agent's failure
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _run_ranks(conn: socket.socket, request: dict[str, Any]) -> list[tuple[int, int]]:
    """Fork the ranks and wait for them (stopping the rest when one fails, or all when the launcher goes away);
    (rank, exit code) in the order they exited, a signal's as minus its number."""
    nproc = int(request["nproc"])
    port = _free_port()
    log = os.open(request["log_file"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pids = {}
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            _rank(rank, nproc, port, log, request)
        pids[pid] = rank
    os.close(log)
    pids_file = Path(request["log_file"]).with_name(PIDS_FILE)  # who to look for (tests, a stuck run)
    write_json_atomic(pids_file, {"agent": os.getpid(), "ranks": sorted(pids, key=pids.__getitem__)})  # never half read
    exits: dict[int, int] = {}
    stop_at = None
    while len(exits) < nproc:
        if _launcher_gone(conn):
            os.killpg(0, signal.SIGKILL)
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if stop_at is not None and time.monotonic() > stop_at:
                _signal_ranks(pids, exits, signal.SIGKILL)
            time.sleep(0.05)
            continue
        if pid in pids:
            exits[pids[pid]] = os.waitstatus_to_exitcode(status)
            if exits[pids[pid]] != 0 and stop_at is None:  # torchrun stops the group when one rank fails
                _signal_ranks(pids, exits, signal.SIGTERM)
                stop_at = time.monotonic() + STOP_GRACE_S
    return list(exits.items())


def _signal_ranks(pids: dict[int, int], exits: dict[int, int], sig: int) -> None:
    for pid, rank in pids.items():
        if rank not in exits:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _rank(rank: int, nproc: int, port: int, log: int, request: dict[str, Any]) -> None:
    """One rank: torchrun's environment, output to the job's log, then the worker's entry point; never returns."""
    code = 1
    try:
        die_with_parent()  # the agent's death (a stop from the launcher) takes this rank along
        if os.getppid() == 1:
            return
        os.dup2(log, 1)
        if "err_file" in request:  # a module job's stderr apart from its answer on stdout
            os.dup2(os.open(request["err_file"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), 2)
        else:
            os.dup2(log, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(
            RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CONVCHECK_WARM_RANK="1",
        )  # fmt: skip
        os.chdir(request["cwd"])
        sys.path[1:1] = request["extra_paths"]  # where a fresh rank has the job's PYTHONPATH: after its cwd
        import tempfile

        tempfile.tempdir = None  # the server may have cached its own TMPDIR; the rank's is the job's
        if "script" in request:
            code = _run_script(request["script"], request.get("argv", []))
        elif "module" in request:
            code = _run_module(request["module"], request.get("argv", []))
        else:
            sys.argv = ["convcheck.engine.worker", request["job_file"]]
            code = main([request["job_file"]])
        sys.stdout.flush()
        sys.stderr.flush()
        reap_children()
    except BaseException:  # noqa: BLE001 - reported as the rank's exit code, the traceback in its log
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _run_script(script: str, argv: list[str]) -> int:
    """Run `script` as `python script ARGV...` would in this rank (its folder first on the path, as `__main__`); its
    exit code (SystemExit's, 0 when it returns)."""
    import runpy

    sys.argv = [script, *argv]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    return _exit_code(lambda: runpy.run_path(script, run_name="__main__"))


def _run_module(module: str, argv: list[str]) -> int:
    """Run `module` as `python -m MODULE ARGV...` would in this process (as `__main__`); its exit code."""
    import runpy

    sys.argv = [module, *argv]
    sys.path[0] = os.getcwd()  # as `python -m` puts its working folder first
    return _exit_code(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))


def _exit_code(run: Any) -> int:
    """The exit code a Python process running `run()` as its main program ends with: SystemExit's (a message as 1,
    printed on stderr), 0 when it returns."""
    try:
        run()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    return 0


def _free_port() -> int:
    """A TCP port free on the loopback now (the rendezvous port of the job's rank 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launcher_gone(conn: socket.socket) -> bool:
    """True when the launcher closed its end (it died or gave up): its ranks must not outlive it."""
    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _read_message(conn: socket.socket) -> dict[str, Any] | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
