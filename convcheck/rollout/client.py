"""Rank 0's side of the engine: start the engine host in the engine's environment, send it requests, stream a sync
into it through shared-memory buckets, and stop it (and everything it left) whatever happens."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from convcheck.errors import BadInput
from convcheck.rollout import protocol
from convcheck.rollout.buckets import BucketWriter, FileWriter
from convcheck.rollout.environment import engine_env, repo_root
from convcheck.rollout.lifeline import die_with_parent
from convcheck.rollout.segments import segment_folder
from convcheck.rollout.warm_link import WarmProcess, start_warm

REQUEST_TIMEOUT_S = 450.0
"""Seconds a request may go unanswered (loading included) when the run gives no bound."""


def engine_timeout(job_timeout_s: float) -> float:
    """Half the run's --timeout for any one request: a hung engine is named before the launcher's own timeout (which
    counts the whole run) stops the ranks without knowing why."""
    return max(5.0, 0.5 * job_timeout_s)


class EngineFailed(BadInput):
    """The engine could not start on this model, crashed or hung: convcheck cannot run the engine oracle (exit 2,
    naming the engine's own reason), never a finding."""


class EngineCannotRun(EngineFailed):
    """The engine raised NotImplementedError while loading the model: it has no kernel for this architecture on this
    platform (e.g. CPU vLLM and a non-gated MoE). The engine oracle's verdict is `not-covered`, quoting the reason."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
        """The engine's own exception line and where it was raised."""


class EngineHost:
    """The engine process (`python -m convcheck.rollout.host` under the engine's interpreter) and its buckets."""

    def __init__(self, python: str, log: Path, chunk_mb: float, timeout_s: float = REQUEST_TIMEOUT_S,
                 transport: str = "shm") -> None:  # fmt: skip
        self.python = python
        self.timeout_s = timeout_s
        """How long any request may go unanswered before the engine counts as hung."""
        self.log = log
        self.transport = transport
        """"shm": buckets in one shared-memory file, streamed; "folder": safetensors files read at the end."""
        self.capacity = int(chunk_mb * (1 << 20))
        self.folder = segment_folder(None if transport == "shm" else Path(tempfile.gettempdir()))
        self.writer = BucketWriter(self.folder, self.capacity)
        self.folder_bytes = 0
        self.process: subprocess.Popen[bytes] | WarmProcess | None = None
        self.started_as = ""
        """"warm": forked by the warm engine server; "fresh": a new interpreter."""
        self._log_handle: Any = None

    def __enter__(self) -> EngineHost:
        if self.process is None:
            self.start()
        return self

    def start(self) -> None:
        """Start the engine's process (it then waits for requests): forked by the warm engine server when one is set
        and admits this client (convcheck.rollout.warm_link), else a fresh interpreter."""
        self._log_handle = open(self.log, "ab")
        self.process = start_warm(self.python, self._log_handle)
        if self.process is not None:
            self.started_as = "warm"
            return
        self.started_as = "fresh"
        try:
            self.process = subprocess.Popen(
                [self.python, "-m", "convcheck.rollout.host"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log_handle,
                env=engine_env(),
                cwd=str(repo_root()),
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        except OSError as exc:
            self.close()
            raise EngineFailed(f"cannot start the engine's interpreter {self.python}: {exc}") from None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply; EngineFailed when the engine raises, dies or hangs."""
        self.begin(op, **fields)
        return self.finish(op)

    def begin(self, op: str, **fields: Any) -> None:
        """Send a request without waiting (its reply is read by `finish`)."""
        assert self.process is not None and self.process.stdin is not None
        with self._watching(f"{op!r}"):
            protocol.send(self.process.stdin, {"op": op, **fields})

    def finish(self, op: str) -> dict[str, Any]:
        """The reply to the request `op` sent last; EngineFailed when the engine raised, died or hung."""
        assert self.process is not None and self.process.stdout is not None
        with self._watching(f"{op!r}"):
            return _answered(protocol.receive(self.process.stdout, self.timeout_s), f"{op!r}")

    @property
    def bytes_sent(self) -> int:
        """Tensor bytes sent to the engine so far (either transport)."""
        return self.writer.bytes_sent + self.folder_bytes

    def sync(self, receiver: str, items: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """Hand `items` to the engine's receiver and return its reply: streamed in shared-memory buckets (waiting for
        each bucket's ack before reusing the file), or written as safetensors files it reads once all are written."""
        assert self.process is not None and self.process.stdin is not None and self.process.stdout is not None
        pipe_in, pipe_out = self.process.stdin, self.process.stdout
        if self.transport == "folder":
            return self._sync_files(receiver, items, pipe_in, pipe_out)
        with self._watching("the sync"):
            protocol.send(pipe_in, {"op": "sync", "receiver": receiver})
            for name, tensor in items:
                if not self.writer.fits(tensor):
                    self._ship(pipe_in, pipe_out)
                self.writer.add(name, tensor)
            if self.writer.items:
                self._ship(pipe_in, pipe_out)
            protocol.send(pipe_in, {"op": "end"})
            return _answered(protocol.receive(pipe_out, self.timeout_s), "the sync")

    def _sync_files(self, receiver: str, items: Iterable[tuple[str, torch.Tensor]], pipe_in: Any,
                    pipe_out: Any) -> dict[str, Any]:  # fmt: skip
        """The folder transport: every item written into a fresh folder of safetensors files, the engine told to load
        that folder, the folder removed whatever happens."""
        target = Path(tempfile.mkdtemp(prefix="sync-", dir=self.folder))
        try:
            files = FileWriter(target, self.capacity)
            for name, tensor in items:
                if not files.fits(name, tensor):
                    files.flush()
                files.add(name, tensor)
            files.flush()
            self.folder_bytes += files.bytes_sent
            with self._watching("the sync"):
                protocol.send(pipe_in, {"op": "sync", "receiver": receiver, "folder": str(target)})
                return _answered(protocol.receive(pipe_out, self.timeout_s), "the sync")
        finally:
            shutil.rmtree(target, ignore_errors=True)

    @contextmanager
    def _watching(self, what: str) -> Iterator[None]:
        """EngineFailed naming `what` when the engine's pipe closes (it died) or it does not answer in time (hung)."""
        try:
            yield
        except (BrokenPipeError, protocol.HostGone):
            raise EngineFailed(
                f"the engine process died during {what} ({self._exit_status()}); {self.log_tail()}"
            ) from None
        except protocol.HostTimeout:
            raise EngineFailed(
                f"the engine process hung during {what} (no answer within {self.timeout_s:g} s); stopped it"
            ) from None

    def _ship(self, pipe_in: Any, pipe_out: Any) -> None:
        protocol.send(pipe_in, self.writer.message())
        ack = protocol.receive(pipe_out, self.timeout_s)
        if not ack.get("ack"):
            raise EngineFailed(f"the engine answered a bucket with {ack}")

    def log_tail(self, lines: int = 3) -> str:
        """The last error-looking lines of the engine's log (its own reason)."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "no engine log"
        picked = [t.strip() for t in text if ("Error" in t or "error" in t) and "WARNING" not in t]
        return "engine log: " + " | ".join(picked[-lines:])[-600:] if picked else "no error in the engine log"

    def _exit_status(self) -> str:
        if self.process is None:
            return "not started"
        try:
            code = self.process.wait(timeout=5)  # its pipe closed: it is exiting
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def close(self) -> None:
        """Stop the engine (quit, then SIGTERM, then SIGKILL to its whole session) and remove the buckets."""
        process, self.process = self.process, None
        if process is not None:
            try:
                if process.poll() is None and process.stdin is not None:
                    protocol.send(process.stdin, {"op": "quit"})
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
            _stop_session(process)
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    protocol.forget(pipe)
                    pipe.close()
            if isinstance(process, WarmProcess):
                process.sock.close()
        self.writer.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None


def _answered(reply: dict[str, Any], what: str) -> dict[str, Any]:
    """The engine's reply, or EngineFailed quoting what the engine raised and where."""
    if not reply.get("ok"):
        where = f" at {reply['where']}" if reply.get("where") else ""
        message = f"the engine raised {reply.get('error')}{where} during {what}"
        if what == "'start'" and str(reply.get("error", "")).startswith("NotImplementedError"):
            raise EngineCannotRun(message, f"{reply.get('error')}{where}")
        raise EngineFailed(message)
    return reply


def _stop_session(process: subprocess.Popen[bytes] | WarmProcess) -> None:
    """SIGTERM, then SIGKILL after 5 s, to the engine's session (whatever it started)."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def log_path(folder: str | None) -> Path:
    """Where the engine's own output goes: the job folder when there is one."""
    return Path(folder or tempfile.gettempdir()) / "engine.log"
