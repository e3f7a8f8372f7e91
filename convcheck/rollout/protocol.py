"""The engine host's wire: one JSON object per line over a pipe, each way (no torch: both sides import it).

Requests are `{"op": NAME, ...}`; every request gets one reply `{"ok": true, ...}` or `{"ok": false, "error": LINE,
"where": FILE:LINE}`. During a sync the client sends `bucket` messages (no reply but an `ack` line once the host
has copied the bucket out) and one `end`, after which the sync's reply comes.
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import IO, Any

PROMPTS: tuple[tuple[int, ...], ...] = ((3, 17, 42, 99, 5, 120, 7, 64, 11, 140, 23, 88), (150, 2, 76, 31, 9, 101))
"""The fixed prompts (token ids below every fixture's vocabulary of 152) whose prompt logprobs and greedy tokens
are compared."""
MAX_TOKENS = 8
"""Greedy tokens generated after each prompt."""


class HostGone(Exception):
    """The engine process closed its pipe (it crashed or was killed)."""


class HostTimeout(Exception):
    """The engine process did not answer in time."""


def send(stream: IO[bytes], message: dict[str, Any]) -> None:
    """Write one message line and flush."""
    stream.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    stream.flush()


def receive(stream: IO[bytes], timeout_s: float | None = None) -> dict[str, Any]:
    """Read one message line; HostGone at end of stream, HostTimeout after `timeout_s` seconds without one."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    fd = stream.fileno()
    buffer = _BUFFERS.setdefault(fd, bytearray())
    while b"\n" not in buffer:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            raise HostTimeout(f"no answer within {timeout_s:g} s")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise HostGone("the engine process closed its pipe")
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return json.loads(line)


_BUFFERS: dict[int, bytearray] = {}
"""Bytes read past the last full line, per file descriptor (`receive` reads raw, unbuffered)."""


def forget(stream: IO[bytes]) -> None:
    """Drop what was buffered for `stream` (its descriptor may be reused once it is closed)."""
    _BUFFERS.pop(stream.fileno(), None)
