"""Chunked tensor broadcast: per tensor a fixed-size header (JSON: name, dtype, shape, bytes sent), then its raw
bytes in chunks of at most `chunk_bytes`, over a process group of its own; a null header ends the stream."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

HEADER_BYTES = 4096
"""Size of the header broadcast: 8 bytes of length, then the JSON text, zero-padded."""
_GROUP: Any = None


def sync_group() -> Any:
    """A process group over every rank, separate from Megatron's (collective on first use, then reused)."""
    global _GROUP
    if _GROUP is None:
        _GROUP = dist.new_group(ranks=list(range(dist.get_world_size())))
    return _GROUP


def chunk_bytes(chunk_mb: float) -> int:
    """`--chunk-mb` in bytes (at least one)."""
    return max(1, int(chunk_mb * 2**20))


def payload(name: str, tensor: Any) -> Any:
    """The bytes the sender puts on the wire for `tensor`: its raw bytes, flat uint8 (`name` is for plants)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


@dataclass(frozen=True, slots=True)
class Received:
    """One tensor as a receiver reassembled it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: Any
    """1-D uint8 CPU tensor: every byte that arrived."""

    @property
    def expected_bytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()

    @property
    def complete(self) -> bool:
        return self.data.numel() == self.expected_bytes

    def tensor(self) -> Any:
        """The tensor (dtype and shape from the header); a short or long payload stays raw uint8 bytes."""
        if not self.complete:
            return self.data
        return self.data.view(getattr(torch, self.dtype)).reshape(self.shape)


class Channel:
    """One broadcast stream from global rank `src` over `group`; counts bytes, chunks and seconds spent sending."""

    def __init__(self, group: Any, src: int, chunk: int, device: str = "cpu") -> None:
        self.group, self.src, self.chunk, self.device = group, src, chunk, device
        self.bytes = 0
        self.chunks = 0
        self.seconds = 0.0

    def _header(self, header: Any) -> Any:
        """Broadcast `header` (on src; any JSON value) and return it on every rank: one fixed-size broadcast."""
        box = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
        if dist.get_rank() == self.src:
            text = json.dumps(header).encode()
            if len(text) > HEADER_BYTES - 8:
                raise ValueError(f"broadcast header longer than {HEADER_BYTES - 8} bytes: {text[:80]!r}...")
            box[:8] = torch.tensor(list(len(text).to_bytes(8, "little")), dtype=torch.uint8)
            box[8 : 8 + len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        wire = box.to(self.device) if self.device != "cpu" else box
        dist.broadcast(wire, self.src, self.group)
        raw = wire.cpu().numpy().tobytes()
        size = int.from_bytes(raw[:8], "little")
        return json.loads(raw[8 : 8 + size])

    def send(self, name: str, tensor: Any) -> None:
        """On `src`: broadcast `tensor` under `name`."""
        t0 = time.perf_counter()
        raw = payload(name, tensor)
        dtype = str(tensor.dtype).removeprefix("torch.")
        self._header([name, dtype, list(tensor.shape), raw.numel()])
        for start in range(0, raw.numel(), self.chunk):
            piece = raw[start : start + self.chunk]
            dist.broadcast(piece.to(self.device) if piece.device.type != self.device else piece, self.src, self.group)
            self.chunks += 1
        self.bytes += raw.numel()
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        """On `src`: tell the receivers the stream has ended."""
        self._header(None)

    def recv(self) -> Received | None:
        """Elsewhere: the next tensor as reassembled from its chunks, or None at the end of the stream."""
        t0 = time.perf_counter()
        header = self._header(None)
        if header is None:
            return None
        name, dtype, shape, sent = header
        buffer = torch.empty(sent, dtype=torch.uint8, device=self.device)
        for start in range(0, sent, self.chunk):
            dist.broadcast(buffer[start : start + self.chunk], self.src, self.group)
            self.chunks += 1
        self.bytes += sent
        self.seconds += time.perf_counter() - t0
        return Received(name=name, dtype=dtype, shape=tuple(shape), data=buffer.cpu())
