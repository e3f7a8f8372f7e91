"""Cross-rank quick digests of many tensors with one wait on the device per batch, not one per tensor.

`compare.fold.quick_digest` of a GPU tensor waits for the device to reach it (a host copy, or the fold's sums). An
export yields thousands of small tensors, and a wait per tensor stalls the queue the export keeps full. Here each
GPU tensor's bytes (at most SMALL_BYTES) or its fold sums are copied into one pinned host buffer without waiting;
the host hashes them when the buffer fills and at `flush`, after one synchronize. The strings are quick_digest's.
"""

from __future__ import annotations

from typing import Any

import torch

from convcheck.compare.bits import int_view, tensor_sha256
from convcheck.compare.fold import SMALL_BYTES, finish, folded, quick_digest

ALIGN = 8
"""Each staged piece starts at a multiple of this many bytes of the buffer."""
CAPACITY = 16 << 20
"""Bytes of the host buffer (every staged piece is at most 1 MiB: SMALL_BYTES, or the fold's last level)."""


class DigestQueue:
    """Writes `quick_digest(tensor)` into `into[key]`: at once for a CPU tensor, at the next flush for a GPU one."""

    def __init__(self, capacity: int = CAPACITY, *, defer_cpu: bool = False) -> None:
        self.capacity = capacity
        self.defer_cpu = defer_cpu
        """Stage CPU tensors too (a plain buffer, nothing to wait on): lets the staging be tested without a GPU."""
        self._buffer: Any = None
        self._used = 0
        self._pending: list[tuple[dict[str, Any], str, bytes | None, int, int]] = []
        self._devices: set[Any] = set()

    def put(self, into: dict[str, Any], key: str, tensor: Any) -> None:
        """Have `into[key]` hold the tensor's quick digest by the next `flush` (now, for a CPU tensor)."""
        staged = self.defer_cpu if tensor.is_cpu else tensor.device.type == "cuda"
        if not staged:
            into[key] = quick_digest(tensor)
            return

        if tensor.nbytes > SMALL_BYTES:
            head, data = folded(tensor)
        else:
            head, data = None, int_view(tensor)
        data = data.reshape(-1).view(torch.uint8)
        size = data.numel()
        if self._used + size > self.capacity:
            self.flush()
        if self._buffer is None or self._buffer.numel() < size:
            self._buffer = _host_buffer(max(self.capacity, size), pinned=not tensor.is_cpu)
        self._buffer[self._used : self._used + size].copy_(data, non_blocking=True)
        self._pending.append((into, key, head, self._used, size))
        self._used += -size % ALIGN + size  # the next piece starts aligned for its int32 view
        if not tensor.is_cpu:
            self._devices.add(tensor.device)

    def flush(self) -> None:
        """Wait once for the devices, then hash every staged piece into its record."""
        for device in self._devices:
            torch.cuda.synchronize(device)
        for into, key, head, start, size in self._pending:
            piece = self._buffer[start : start + size]
            if head is None:
                into[key] = "sha256:" + tensor_sha256(piece)
            else:
                into[key] = finish(head, piece.view(torch.int32))
        self._pending.clear()
        self._devices.clear()
        self._used = 0

    def drop(self) -> None:
        """Forget what is staged (the records are not kept) and let the buffer go."""
        if self._devices:  # copies may still be landing in the buffer
            for device in self._devices:
                torch.cuda.synchronize(device)
        self._pending.clear()
        self._devices.clear()
        self._used = 0
        self._buffer = None


def _host_buffer(size: int, *, pinned: bool) -> Any:
    """A uint8 host buffer of `size` bytes, page-locked when `pinned` and the platform allows (copies into it from a
    GPU then do not wait)."""
    if pinned:
        try:
            return torch.empty(size, dtype=torch.uint8, pin_memory=True)
        except RuntimeError:  # no pinned memory here: the copies wait, the digests are the same
            pass
    return torch.empty(size, dtype=torch.uint8)
