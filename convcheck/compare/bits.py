"""Bitwise tensor comparison over integer views (never allclose, never torch.equal on floating values)."""

from __future__ import annotations

from typing import Any

import torch

from convcheck.compare.memory import borrowed_bytes, plain, same_bytes
from convcheck.compare.proven import ProvenBytes
from convcheck.verdict import Finding

_INT_FOR_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def int_view(tensor: Any) -> Any:
    """The same bytes as a flat integer tensor of equal element width (bool as uint8)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    return flat.view(getattr(torch, _INT_FOR_SIZE[flat.element_size()]))


def compare_device(*tensors: Any) -> Any:
    """The one device a comparison of `tensors` runs on: the first one's that is not the CPU, else the CPU."""
    for t in tensors:
        if t.device.type != "cpu":
            return t.device
    return torch.device("cpu")


def together(*tensors: Any) -> tuple[Any, ...]:
    """`tensors` moved to their `compare_device` (those already there are returned as they are)."""
    device = compare_device(*tensors)
    return tuple(t if t.device == device else t.to(device) for t in tensors)


def count_true(mask: Any) -> int:
    """How many elements of a bool tensor are True (no int64 copy, unlike mask.sum())."""
    return int(mask.count_nonzero())


def first_true(mask: Any) -> int:
    """The flat index of the first True of a bool tensor that has one (one byte per element of scratch, not the
    eight per True element of nonzero())."""
    return int(mask.reshape(-1).view(torch.uint8).argmax())


def bytes_equal(expected: Any, actual: Any, proven: ProvenBytes | None = None) -> bool:
    """True when both tensors hold the same raw bytes (plain CPU tensors by memcmp where they lie, others as the
    widest integer view that fits; not read again where `proven`, a convcheck.compare.proven.ProvenBytes, holds the
    pair as proved equal)."""
    if same_view(expected, actual):
        return True  # the same bytes in memory (a view compared with itself)
    if proven is not None and proven.known(expected, actual):
        return True
    expected, actual = together(expected, actual)
    if plain(expected) and plain(actual):
        return same_bytes(expected, actual)  # read in place: no views, no copies
    a = expected.detach().contiguous().reshape(-1).view(torch.uint8)
    b = actual.detach().contiguous().reshape(-1).view(torch.uint8)
    if a.numel() != b.numel():
        return False
    if a.device == b.device and a.data_ptr() == b.data_ptr():
        return True  # the same bytes in memory (a view compared with itself)
    if a.numel() % 8 == 0:
        try:
            a, b = a.view(torch.int64), b.view(torch.int64)
        except RuntimeError:  # storage offset not 8-byte aligned: stay with bytes
            pass
    return int_views_equal(a, b)


def same_view(a: Any, b: Any) -> bool:
    """True when `a` and `b` are the same elements of the same memory: one device, data pointer, dtype, shape and
    strides (so bitwise equal without reading them)."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.device == b.device
    )


def int_views_equal(a: Any, b: Any) -> bool:
    """True when two integer views of one width on one device hold the same values: exact, no float semantics (the
    one place convcheck calls torch.equal, and only on integers)."""
    return bool(torch.equal(a, b))


def same_tensor(expected: Any, actual: Any, proven: ProvenBytes | None = None) -> bool:
    """True when `actual` has the dtype, shape and raw bytes of `expected` (compared on their `compare_device`;
    `proven` as bytes_equal takes it)."""
    if expected.dtype != actual.dtype or tuple(expected.shape) != tuple(actual.shape):
        return False
    return bytes_equal(expected, actual, proven)


def unravel_index(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index in `shape` of the element at `flat_index` of the row-major flattening."""
    out = []
    for dim in reversed(shape):
        out.append(flat_index % dim if dim else 0)
        flat_index = flat_index // dim if dim else 0
    return tuple(reversed(out))


def raw_bytes(tensor: Any) -> memoryview:
    """The raw bytes of `tensor` as a flat CPU buffer (copied off the device when needed)."""
    return memoryview(_host_bytes(tensor).reshape(-1))


def _host_bytes(tensor: Any) -> Any:
    """`tensor`'s bytes as a C-contiguous uint8 numpy array on the host (its shape, the last dim widened)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dim() == 0 or not tensor.is_contiguous():
        tensor = tensor.reshape(-1).contiguous()
    return tensor.view(torch.uint8).numpy()


def tensor_sha256(tensor: Any) -> str:
    """sha256 of a tensor's raw bytes (contiguous, on the CPU): equal digests mean equal bytes. A plain CPU tensor's
    memory is read where it lies (compare.memory), any other is copied to a contiguous host array first."""
    import hashlib

    return hashlib.sha256(borrowed_bytes(tensor) if plain(tensor) else _host_bytes(tensor)).hexdigest()


def describe_element(tensor: Any, flat_index: int) -> str:
    """`value (0xBITS)` for one element of `tensor` given its flat index."""
    flat = tensor.detach().contiguous().reshape(-1)
    bits = int(int_view(flat[flat_index : flat_index + 1])[0]) & ((1 << (8 * flat.element_size())) - 1)
    value = flat[flat_index].item()
    return f"{value!r} (0x{bits:0{2 * flat.element_size()}x})"


def first_difference(expected: Any, actual: Any) -> tuple[int, int, str, str]:
    """(elements that differ, flat index of the first, its expected and actual `value (0xBITS)`) of two tensors of
    one dtype and element count on one device that differ somewhere (integer views of the element width)."""
    diff = int_view(expected) != int_view(actual)
    first = first_true(diff)
    return count_true(diff), first, describe_element(expected, first), describe_element(actual, first)


def compare_bits(name: str, expected: Any, actual: Any) -> Finding | None:
    """None when `actual` has the dtype, shape and bytes of `expected`; else a Finding naming the first difference
    (the two may sit on different devices: they are compared on their `compare_device`)."""
    if expected.dtype != actual.dtype:
        return Finding(
            tensor=name,
            kind="dtype",
            message=f"dtype {_dtype_name(actual)}, expected {_dtype_name(expected)}",
            detail={"expected": str(expected.dtype), "actual": str(actual.dtype)},
        )
    if tuple(expected.shape) != tuple(actual.shape):
        return Finding(
            tensor=name,
            kind="shape",
            message=f"shape {list(actual.shape)}, expected {list(expected.shape)}",
            detail={"expected": list(expected.shape), "actual": list(actual.shape)},
        )
    expected, actual = together(expected, actual)
    if bytes_equal(expected, actual):
        return None
    count, first, exp_s, act_s = first_difference(expected, actual)
    index = unravel_index(first, tuple(expected.shape))
    numel = expected.numel()
    return Finding(
        tensor=name,
        kind="bytes-differ",
        message=f"{count}/{numel} elements differ; first at index {list(index)}: got {act_s}, expected {exp_s}",
        detail={"count": count, "numel": numel, "first_index": list(index), "expected": exp_s, "actual": act_s},
    )


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")
