"""The cross-rank digest (convcheck.fold): equal bytes agree, any changed, moved or added byte disagrees."""

from __future__ import annotations

import pytest
import torch

from convcheck import fold


def _data(n: int) -> torch.Tensor:
    return torch.randint(-(2**15), 2**15, (n,), dtype=torch.int16, generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize(
    "n", [1, 2, 3, 7, fold.WORDS * 2, fold.WORDS * 2 + 1, fold.WORDS * 5 + 3, fold.WORDS * 2 * 300 + 5]
)
def test_any_single_change_changes_the_digest(n: int) -> None:
    """Every bit position class (low, sign of either half of a word, the tail bytes) and a swap of two elements."""
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
    x = _data(4 * fold.WORDS + 10)
    grid = x[: 4 * fold.WORDS].reshape(-1, 64)
    assert fold.digest(grid.t()) == fold.digest(grid.t().contiguous())
    odd = x[1:]  # 2-byte offset: not 4-byte aligned
    assert fold.digest(odd) == fold.digest(odd.clone())
    assert fold.digest(x.view(torch.bfloat16)) == fold.digest(x)
    assert fold.digest(torch.tensor([True, False, True])) == fold.digest(torch.tensor([1, 0, 1], dtype=torch.uint8))


def test_sign_flips_in_many_chunks_are_caught() -> None:
    """Differences that are all high bits (the sign of the upper bf16 of each word) in every chunk."""
    x = _data(8 * fold.WORDS)
    y = x.clone()
    y[1 :: 2 * fold.WORDS // 7] ^= -(2**15)
    assert fold.digest(y) != fold.digest(x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_digest_is_the_cpu_digest() -> None:
    """Ranks on GPUs and a CPU run agree: the same bytes give the same digest on either device."""
    for n in (5, fold.WORDS * 3 + 7, (64 << 20) // 2 + 3):
        x = _data(n)
        assert fold.digest(x.cuda()) == fold.digest(x)


def test_the_float_sums_are_the_exact_integer_sums() -> None:
    """The worst case for magnitude (every word -2**15, every key near 2**26) sums exactly: the float64 product
    equals the integer one, for a full and a partial chunk."""
    n = fold.WORDS * 3 + 11
    for words in (torch.full((n,), -(2**15), dtype=torch.int16), _data(n)):
        got = fold.chunk_sums(words).to(torch.int64)
        padded = torch.zeros(4 * fold.WORDS, dtype=torch.int64)
        padded[:n] = words.to(torch.int64)
        keys = fold._lanes("cpu").to(torch.int64)
        want = keys @ padded.view(4, fold.WORDS).t()
        assert torch.equal(got, want)
    assert int(fold._lanes("cpu").max()) < 2**fold.KEY_BITS and fold.WORDS * 2**15 * 2**fold.KEY_BITS <= 2**53
