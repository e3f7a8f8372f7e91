"""sha256 of a stream of tensors on worker threads (hashlib releases the GIL), with a bound on the bytes waiting."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from convcheck.compare.bits import tensor_sha256
from convcheck.compare.threads import default_threads

DEFAULT_BUDGET = 256 << 20
"""Bytes of CPU copies that may wait for a hashing thread (a tensor larger than this waits alone)."""
INLINE_BYTES = 64 << 10
"""A tensor of at most this many bytes is hashed at `submit`, on the caller's thread: handing it to a hashing thread
costs more than its sha256 (~40 us for 64 KiB), and an export of a few thousand small tensors paid that per tensor."""


class HashPool:
    """Digest tensors as they stream: `submit` returns at once unless `budget` bytes already wait; `results` waits.

    `on_done(name, sha256, cpu_tensor)` runs on the hashing thread for each tensor (keep the copy only if needed)."""

    def __init__(
        self,
        on_done: Callable[[Any, str, Any], None] | None = None,
        threads: int | None = None,
        budget: int = DEFAULT_BUDGET,
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads or default_threads(), thread_name_prefix="sha256")
        self._room = threading.Condition()
        self._waiting = 0
        self._budget = budget
        self._on_done = on_done
        self._futures: dict[Hashable, Future[str]] = {}

    def submit(self, name: Hashable, tensor: Any) -> None:
        """Queue a copy of `tensor` on the CPU (taken now: the producer may reuse its buffer) for hashing under `name`
        (any hashable key)."""
        size = tensor.numel() * tensor.element_size()
        if size <= INLINE_BYTES:
            self._futures[name] = self._inline(name, tensor)
            return
        with self._room:  # wait for room before copying: at most `budget` bytes (or one tensor) are held here
            self._room.wait_for(lambda: self._waiting == 0 or self._waiting + size <= self._budget)
            self._waiting += size
        try:
            cpu = tensor.detach().to("cpu", copy=True).contiguous()
        except BaseException:
            self._release(size)
            raise
        self._futures[name] = self._pool.submit(self._hash, name, cpu, size)

    def _inline(self, name: Hashable, tensor: Any) -> Future[str]:
        """A done future of a small tensor's sha256, or of what hashing it raised (re-raised by `results`); no copy
        taken when nothing keeps it."""
        done: Future[str] = Future()
        try:
            if self._on_done is None:
                done.set_result(tensor_sha256(tensor))
            else:
                cpu = tensor.detach().to("cpu", copy=True).contiguous()
                value = tensor_sha256(cpu)
                if self._on_done is not None:
                    self._on_done(name, value, cpu)
                done.set_result(value)
        except Exception as exc:  # noqa: BLE001 - raised by results(), as a hashing thread's error is
            done.set_exception(exc)
        return done

    def _hash(self, name: Hashable, cpu: Any, size: int) -> str:
        try:
            value = tensor_sha256(cpu)
            if self._on_done is not None:
                self._on_done(name, value, cpu)
            return value
        finally:
            self._release(size)

    def _release(self, size: int) -> None:
        with self._room:
            self._waiting -= size
            self._room.notify_all()

    def results(self) -> dict[Hashable, str]:
        """Every submitted name's sha256 (waits for the threads; re-raises a hashing error)."""
        try:
            return {name: future.result() for name, future in self._futures.items()}
        finally:
            self._pool.shutdown(wait=True)
