"""compare.digest_queue: the staged digests are quick_digest's, whatever the order, sizes and flushes."""

from __future__ import annotations

import hashlib

import pytest
import torch

from convcheck.compare import fold
from convcheck.compare.digest_queue import DigestQueue


def _device_quick_digest(t: torch.Tensor) -> str:
    """quick_digest as a GPU rank computes it: sha256 of the bytes up to SMALL_BYTES, the fold above."""
    if t.nbytes > fold.SMALL_BYTES:
        return fold.digest(t)
    return "sha256:" + hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _tensors() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    out = [torch.randn(n, dtype=torch.bfloat16, generator=gen) for n in (1, 3, 4097, 100)]
    out.append(torch.randn(64, 48, generator=gen).t())  # not contiguous
    out.append(torch.randint(0, 255, ((fold.SMALL_BYTES // 2) + 3,), dtype=torch.int16, generator=gen))  # folded
    out.append(torch.tensor([True, False, True]))
    out.append(torch.zeros(0))
    return out


@pytest.mark.parametrize("capacity", [64, 5000, 16 << 20])
def test_staged_digests_are_the_device_quick_digests(capacity: int) -> None:
    """Flushed when the buffer fills (a piece larger than it gets a buffer of its own) and at the end."""
    tensors = _tensors()
    queue = DigestQueue(capacity, defer_cpu=True)
    records = [{} for _ in tensors]
    for rec, t in zip(records, tensors):
        queue.put(rec, "digest", t)
    queue.flush()
    assert [r["digest"] for r in records] == [_device_quick_digest(t) for t in tensors]
    assert len({r["digest"] for r in records}) == len(tensors)


def test_one_changed_bit_changes_the_staged_digest_and_cpu_tensors_are_digested_at_once() -> None:
    t = torch.randn(300, dtype=torch.bfloat16)
    flipped = t.clone()
    flipped.view(torch.int16)[150] ^= -(2**15)
    queue = DigestQueue(defer_cpu=True)
    a, b = {}, {}
    queue.put(a, "d", t)
    queue.put(b, "d", flipped)
    assert a == b == {}  # not yet: staged
    queue.flush()
    assert a["d"] != b["d"]
    now: dict[str, str] = {}
    DigestQueue().put(now, "d", t)  # a CPU tensor outside the test mode: quick_digest at once
    assert now["d"] == fold.quick_digest(t) == a["d"]


def test_drop_forgets_what_is_staged() -> None:
    queue = DigestQueue(defer_cpu=True)
    rec: dict[str, str] = {}
    queue.put(rec, "d", torch.ones(4))
    queue.drop()
    queue.flush()
    assert rec == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_tensors_are_staged_and_agree_with_quick_digest() -> None:
    tensors = [t.cuda() for t in _tensors()]
    queue = DigestQueue(1 << 20)
    records = [{} for _ in tensors]
    for rec, t in zip(records, tensors):
        queue.put(rec, "digest", t)
    queue.flush()
    assert [r["digest"] for r in records] == [fold.quick_digest(t) for t in tensors]
    assert [r["digest"] for r in records] == [_device_quick_digest(t.cpu()) for t in tensors]
