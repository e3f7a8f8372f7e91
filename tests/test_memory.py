"""compare.memory: memcmp over two CPU tensors' bytes where they lie, and who may take it."""

import pytest
import torch

from convcheck.compare.bits import bytes_equal
from convcheck.compare.memory import equal_at, plain, same_bytes
from convcheck.probe.runs import mismatched_runs, mismatched_runs_in_place


def test_same_bytes_is_bitwise_not_by_value() -> None:
    a = torch.zeros(6)
    b = a.clone()
    assert same_bytes(a, b)
    b[4] = -0.0  # equal by value, not by bytes
    assert torch.equal(a, b) and not same_bytes(a, b) and not bytes_equal(a, b)
    nan = torch.full((3,), float("nan"))
    assert same_bytes(nan, nan.clone())  # the same NaN payload: equal bytes, unlike a value compare
    assert not same_bytes(a, a[:5].clone())  # another byte count
    assert same_bytes(torch.zeros(0), torch.zeros(0, dtype=torch.int8))


def test_equal_at_reads_only_the_named_ranges_and_refuses_any_outside() -> None:
    a = torch.arange(10, dtype=torch.int16)
    b = torch.arange(20, dtype=torch.int16)
    assert equal_at(a, 2, b, 2, 8) and equal_at(a[3:], 0, b, 3, 7)  # a view starts at its own first element
    assert not equal_at(a, 0, b, 1, 3)
    b[15] = 5
    assert equal_at(a, 5, b, 5, 5) and not equal_at(a.clone().add_(10), 0, b, 10, 10)
    with pytest.raises(ValueError, match="outside"):
        equal_at(a, 5, b, 0, 6)
    with pytest.raises(ValueError, match="outside"):
        equal_at(a, 0, b, 15, 6)
    with pytest.raises(ValueError, match="widths"):
        equal_at(a, 0, b.to(torch.int32), 0, 2)


def test_only_plain_cpu_tensors_are_read_in_place() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert plain(t) and plain(t[1:]) and plain(t.to(torch.bool))
    assert not plain(t.t()) and not plain(t[:, 1:])  # their memory is not their values in order
    assert not plain(torch.zeros(2, dtype=torch.complex64).conj())
    assert not plain(t.to_sparse())
    assert not plain(torch.zeros(3, device="meta"))


def test_in_place_run_compare_finds_what_the_integer_views_find() -> None:
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(64, dtype=torch.bfloat16, generator=gen)
    real = torch.cat([weight[32:48], weight[0:16]])
    runs = torch.tensor([[0, 32, 16], [16, 0, 16]])
    views = (real.view(torch.int16), weight.view(torch.int16))
    assert mismatched_runs_in_place(real, weight, runs) == mismatched_runs(*views, runs) == []
    real[20] = -real[20]  # a sign flip in the second run
    assert mismatched_runs_in_place(real, weight, runs) == mismatched_runs(*views, runs) == [1]
    assert mismatched_runs_in_place(real[::2], weight, runs[:1]) is None  # not contiguous
    assert mismatched_runs_in_place(real, weight.float(), runs) is None  # another width
    assert mismatched_runs_in_place(real, weight, torch.tensor([[20, 0, 16]])) is None  # outside: left to slices
