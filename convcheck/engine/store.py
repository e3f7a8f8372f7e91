"""The multi-node meeting point's key-value store, in the standard library: node 0's launcher serves it over TCP,
every launcher (node 0's too) talks to it through a `StoreClient`.

One JSON line per request and per reply on one connection per client. Keys hold text; `add` counts. `wait` and
`get` block in the server until the keys exist or the timeout passes. A lost connection or a timeout raises
StoreError (a RuntimeError), so a caller handles both as a lost meeting point.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from typing import Any

CONNECT_RETRY_S = 0.2
"""Pause between attempts to reach node 0 while it is not listening yet."""


class StoreError(RuntimeError):
    """The store could not answer: the connection is gone, or it was not reached in time."""


class StoreTimeout(StoreError):
    """`wait` or `get` timed out before every key existed."""


class _Handler(socketserver.StreamRequestHandler):
    server: StoreServer

    def handle(self) -> None:
        for line in self.rfile:
            try:
                reply = self.server.answer(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"error": f"bad request: {exc}"}
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()


class StoreServer(socketserver.ThreadingTCPServer):
    """Node 0's store: the values and a condition every waiting request sleeps on."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int) -> None:
        super().__init__(("", port), _Handler)
        self.values: dict[str, str] = {}
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self.serve_forever, name="convcheck-store", daemon=True)
        self.thread.start()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """One reply: set / add / check answer at once; wait / get sleep until their keys exist or time runs out."""
        op, keys = request["op"], request["keys"]
        with self.changed:
            if op == "set":
                self.values[keys[0]] = str(request["value"])
                self.changed.notify_all()
                return {"ok": True}
            if op == "add":
                value = int(self.values.get(keys[0], "0")) + int(request["value"])
                self.values[keys[0]] = str(value)
                self.changed.notify_all()
                return {"value": value}
            if op == "check":
                return {"ok": all(k in self.values for k in keys)}
            if op in ("wait", "get"):
                done = self.changed.wait_for(lambda: all(k in self.values for k in keys), float(request["timeout"]))
                if not done:
                    return {"timeout": [k for k in keys if k not in self.values]}
                return {"ok": True} if op == "wait" else {"value": self.values[keys[0]]}
        return {"error": f"unknown op {op!r}"}

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class StoreClient:
    """One launcher's connection to the store at `host:port` (requests are serialised by a lock)."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=max(timeout_s, 1.0))
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise StoreError(f"cannot reach {host}:{port}: {exc}") from None
                time.sleep(CONNECT_RETRY_S)
        self._sock.settimeout(None)  # a wait's own timeout bounds it, in the server
        self._file = self._sock.makefile("rwb")
        self._lock = threading.Lock()

    def _ask(self, op: str, keys: list[str], **fields: Any) -> dict[str, Any]:
        with self._lock:
            try:
                self._file.write(json.dumps({"op": op, "keys": keys, **fields}).encode() + b"\n")
                self._file.flush()
                line = self._file.readline()
            except OSError as exc:
                raise StoreError(f"lost the store: {exc}") from None
        if not line:
            raise StoreError("lost the store: the connection was closed")
        reply = json.loads(line)
        if "error" in reply:
            raise StoreError(reply["error"])
        if "timeout" in reply:
            raise StoreTimeout(f"timed out waiting for {', '.join(reply['timeout'])}")
        return reply

    def set(self, key: str, value: str) -> None:
        self._ask("set", [key], value=value)

    def add(self, key: str, amount: int) -> int:
        """The key's count after adding `amount` (a missing key counts from 0)."""
        return int(self._ask("add", [key], value=amount)["value"])

    def check(self, keys: list[str]) -> bool:
        """Whether every key exists now."""
        return bool(self._ask("check", keys)["ok"])

    def wait(self, keys: list[str], timeout_s: float) -> None:
        """Return once every key exists; StoreTimeout after `timeout_s`."""
        self._ask("wait", keys, timeout=timeout_s)

    def get(self, key: str) -> str:
        """The key's value, waiting up to the client's timeout for it to exist."""
        return str(self._ask("get", [key], timeout=self.timeout_s)["value"])

    def close(self) -> None:
        try:
            self._file.close()
            self._sock.close()
        except OSError:
            pass
