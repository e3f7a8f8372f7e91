"""compare_bits: integer-view comparison that sees what torch.equal and allclose miss."""

import torch

from convcheck.compare.bits import compare_bits


def test_equal_bytes_pass() -> None:
    t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    assert compare_bits("w", t, t.clone()) is None


def test_negative_zero_is_a_difference() -> None:
    a = torch.zeros(4)
    b = a.clone()
    b[2] = -0.0
    assert torch.equal(a, b)  # what a value comparison would conclude
    f = compare_bits("w", a, b)
    assert f is not None and f.kind == "bytes-differ"
    assert f.detail["first_index"] == [2] and f.detail["count"] == 1
    assert "0x80000000" in f.message


def test_identical_nan_payloads_are_equal() -> None:
    a = torch.full((3,), float("nan"))
    assert compare_bits("w", a, a.clone()) is None


def test_first_difference_index_and_values() -> None:
    a = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    b = a.clone()
    b[1, 2, 0] = 99.0
    b[1, 2, 3] = 98.0
    f = compare_bits("layer.w", a, b)
    assert f is not None
    assert f.tensor == "layer.w"
    assert f.detail["first_index"] == [1, 2, 0]
    assert f.detail["count"] == 2
    assert "got 99.0" in f.message and "expected 20.0" in f.message


def test_dtype_and_shape_mismatch() -> None:
    a = torch.zeros(2, 3, dtype=torch.bfloat16)
    assert compare_bits("w", a, a.float()).kind == "dtype"  # type: ignore[union-attr]
    assert compare_bits("w", a, a.t()).kind == "shape"  # type: ignore[union-attr]


def test_count_and_first_true_match_sum_and_nonzero() -> None:
    from convcheck.compare.bits import count_true, first_true

    gen = torch.Generator().manual_seed(3)
    for shape in [(1,), (7,), (5, 9), (2, 3, 4)]:
        mask = torch.rand(shape, generator=gen) < 0.3
        mask.reshape(-1)[-1] = True
        assert count_true(mask) == int(mask.sum())
        assert first_true(mask) == int(mask.reshape(-1).nonzero()[0, 0])
    wide = torch.zeros(3, 5, dtype=torch.bool)[:, 1:4]  # a strided view
    wide[2, 1] = True
    assert count_true(wide) == 1 and first_true(wide) == 7


def test_a_view_compared_with_itself_is_equal_without_reading_and_other_views_are_read() -> None:
    from convcheck.compare.bits import bytes_equal, same_view

    buf = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    assert same_view(buf[1:], buf[1:]) and bytes_equal(buf[1:], buf[1:])
    assert not same_view(buf[:, :2], buf[:2, :2]) and not bytes_equal(buf[:, :2].reshape(-1)[:4], buf[1:, :2])
    assert not same_view(buf.t(), buf.t().contiguous()) and bytes_equal(buf.t(), buf.t().contiguous())
    assert not same_view(buf[0], buf[1]) and not bytes_equal(buf[0], buf[1])
    assert not same_view(buf.view(torch.float32), buf)  # same memory, another dtype
