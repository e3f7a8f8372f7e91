"""The cross-rank digest (convcheck.compare.fold): equal bytes agree, any changed, moved or added byte disagrees."""

from __future__ import annotations

import pytest
import torch

from convcheck.compare import fold


def _data(n: int) -> torch.Tensor:
    return torch.randint(-(2**15), 2**15, (n,), dtype=torch.int16, generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("n", [1, 2, 3, 7, fold.CHUNK, fold.CHUNK + 1, fold.CHUNK * 5 // 2 + 3, fold.CHUNK * 300 + 5])
def test_any_single_change_changes_the_digest(n: int) -> None:
    """Every bit position class (low, the sign of either byte of a word, the last partial chunk) and a swap of two
    elements."""
    x = _data(n).view(torch.bfloat16)
    base = fold.digest(x)
    assert fold.digest(x.clone()) == base
    for at in {0, n // 2, n - 1}:
        for bit in (0, 14, 15):
            y = x.clone().view(torch.int16)
            y[at] ^= -(2**15) if bit == 15 else 1 << bit
            assert fold.digest(y.view(torch.bfloat16)) != base, (at, bit)
    if n > 1 and x.view(torch.int16)[0] != x.view(torch.int16)[-1]:
        y = x.clone()
        y[0], y[-1] = x[-1], x[0]
        assert fold.digest(y) != base
    assert fold.digest(x[:-1]) != base or n == 0


def test_same_bytes_any_layout_and_dtype() -> None:
    """The digest is of the raw bytes: a non-contiguous or unaligned view digests like its contiguous copy."""
    x = _data(2 * fold.CHUNK + 10)
    grid = x[: 2 * fold.CHUNK].reshape(-1, 64)
    assert fold.digest(grid.t()) == fold.digest(grid.t().contiguous())
    odd = x[1:]  # 2-byte offset: not 4-byte aligned
    assert fold.digest(odd) == fold.digest(odd.clone())
    assert fold.digest(x.view(torch.bfloat16)) == fold.digest(x)
    assert fold.digest(torch.tensor([True, False, True])) == fold.digest(torch.tensor([1, 0, 1], dtype=torch.uint8))


def test_sign_flips_in_many_chunks_are_caught() -> None:
    """Differences that are all high bits (the sign of the upper byte of a bf16) in every chunk."""
    x = _data(4 * fold.CHUNK)
    y = x.clone()
    y[1 :: fold.CHUNK // 7] ^= -(2**15)
    assert fold.digest(y) != fold.digest(x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_digest_is_the_cpu_digest() -> None:
    """Ranks on GPUs and a CPU run agree: the same bytes give the same digest on either device."""
    for n in (5, fold.CHUNK * 3 + 7, fold.CHUNK * 40 + 1, (64 << 20) // 2 + 3):
        x = _data(n)
        assert fold.digest(x.cuda()) == fold.digest(x)


def test_the_sums_are_the_exact_integer_sums() -> None:
    """The worst case for magnitude (every byte and key -128) and random bytes sum exactly, through the int8 kernel
    and through the float64 fallback, for full chunks and a partial one."""
    n = fold.CHUNK * 3 + 11
    keys = fold._lanes("cpu")
    assert int((keys == 0).sum()) == 0 and keys.shape == (fold.CHUNK, fold.LANES)
    for data in (torch.full((n,), -128, dtype=torch.int8), _data(n).view(torch.int8)[:n]):
        padded = torch.zeros(4 * fold.CHUNK, dtype=torch.int64)
        padded[:n] = data.to(torch.int64)
        want = padded.view(4, fold.CHUNK) @ keys.to(torch.int64)
        assert torch.equal(fold.chunk_sums(data).to(torch.int64), want)
    worst = torch.full((20, fold.CHUNK), -128, dtype=torch.int8)
    assert int(fold._sums(worst, torch.full_like(keys, -128))[0, 0]) == 2**14 * fold.CHUNK < 2**31


def test_the_fallback_gives_the_kernels_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the int8 kernel cannot run, the float64 path gives the same digest."""
    x = _data(fold.CHUNK * 3 + 5)
    base = fold.digest(x)

    def refuse(*_: object) -> None:
        raise RuntimeError("no int8 kernel here")

    monkeypatch.setattr(torch, "_int_mm", refuse)
    assert fold.digest(x) == base


def test_sums_folded_again_on_the_device_still_tell_every_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the host limit below the sums' size the digest takes two more levels; a changed bit in the first or the
    last chunk still changes it."""
    x = _data(fold.CHUNK * 40 + 3)
    one_level = fold.digest(x)
    monkeypatch.setattr(fold, "HOST_BYTES", 64)
    base = fold.digest(x)
    assert base != one_level and fold.digest(x.clone()) == base
    for at in (0, x.numel() - 1):
        y = x.clone()
        y[at] ^= 1
        assert fold.digest(y) != base


@pytest.mark.parametrize("n", [1, 7, (1 << 19) + 1])
def test_quick_digest_sees_one_bit_and_keeps_its_kinds_apart(n: int) -> None:
    """quick_digest (the differential's cross-rank digest): sha256 of the bytes of a CPU tensor of any size (the fold
    is for tensors on a GPU); one flipped bit, a moved element or a dropped one changes it, a layout does not."""
    x = _data(n).view(torch.bfloat16)
    base = fold.quick_digest(x)
    assert base.startswith("sha256:")
    assert fold.quick_digest(x.clone()) == base
    for at in {0, n - 1}:
        y = x.clone().view(torch.int16)
        y[at] ^= 1
        assert fold.quick_digest(y.view(torch.bfloat16)) != base
    if n > 1:
        assert fold.quick_digest(x[:-1]) != base
        grid = x[: n - n % 2].reshape(2, -1)
        assert fold.quick_digest(grid.t()) == fold.quick_digest(grid.t().contiguous())
    assert fold.quick_digest(x) != fold.digest(x)
