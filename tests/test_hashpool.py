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


def test_small_tensors_are_hashed_at_submit_with_the_same_digests_and_errors() -> None:
    from convcheck.compare import hashpool

    small = torch.arange(100, dtype=torch.int16)
    strided = torch.arange(64, dtype=torch.float32).reshape(8, 8).t()
    big = torch.arange(hashpool.INLINE_BYTES, dtype=torch.int16)  # twice the inline bytes: a thread hashes it
    kept: dict[str, torch.Tensor] = {}
    pool = HashPool(on_done=lambda name, sha, cpu: kept.__setitem__(name, cpu), threads=1)
    for name, t in (("small", small), ("strided", strided), ("big", big)):
        pool.submit(name, t)
    assert pool._futures["small"].done() and pool._futures["strided"].done()
    small.add_(1)  # the producer reuses its buffer: the kept copy was taken at submit
    assert pool.results() == {"small": _sha(small - 1), "strided": _sha(strided), "big": _sha(big)}
    assert torch.equal(kept["small"], small - 1) and kept["small"].data_ptr() != small.data_ptr()
    plain_pool = HashPool(threads=1)
    plain_pool.submit("s", small)
    assert plain_pool.results() == {"s": _sha(small)}
