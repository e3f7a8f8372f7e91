"""HashPool: the same sha256 as a one-thread hash, the budget never exceeded, errors re-raised."""

from __future__ import annotations

import hashlib
import threading

import pytest
import torch

from convcheck.compare.bits import int_view
from convcheck.compare.hashpool import HashPool


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(int_view(t.contiguous()).numpy().tobytes()).hexdigest()


def test_digests_equal_a_plain_sha256_and_respect_the_budget() -> None:
    tensors = {f"t{i}": torch.arange(i * 1000, dtype=torch.int32).to(torch.bfloat16) for i in range(1, 30)}
    waiting: list[int] = []
    lock = threading.Lock()
    seen: dict[str, torch.Tensor] = {}

    def on_done(name: str, sha: str, cpu: torch.Tensor) -> None:
        with lock:
            seen[name] = cpu
            waiting.append(pool._waiting)

    pool = HashPool(on_done=on_done, threads=3, budget=20_000)
    for name, t in tensors.items():
        pool.submit(name, t)
    got = pool.results()
    assert got == {n: _sha(t) for n, t in tensors.items()}
    assert set(seen) == set(tensors)
    largest = max(t.numel() * t.element_size() for t in tensors.values())
    assert max(waiting) <= max(20_000, largest)


def test_a_hashing_error_is_raised_by_results() -> None:
    def boom(name: str, sha: str, cpu: torch.Tensor) -> None:
        raise RuntimeError(f"cannot keep {name}")

    pool = HashPool(on_done=boom, threads=2)
    pool.submit("x", torch.ones(4))
    with pytest.raises(RuntimeError, match="cannot keep x"):
        pool.results()
