"""Raw-byte equality of host memory by the C library's `memcmp`: two CPU tensors' bytes compared in place.

Bitwise by construction (bytes, no float semantics, nothing copied), and without the tensor views an integer compare
builds: ~3 us for a small expert weight where the views and `torch.equal` take ~30-50, and ~10x faster at 3 MiB on one
core. Only plain strided CPU tensors whose bytes are what they hold qualify (`plain`); others take the integer views.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch


@functools.cache
def _memcmp() -> Any:
    """The C library's memcmp (None where this process has none to call)."""
    try:
        func = ctypes.CDLL(None).memcmp
    except (AttributeError, OSError, TypeError):  # e.g. a platform with no default C library handle
        return None
    func.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    func.restype = ctypes.c_int
    return func


def plain(tensor: Any) -> bool:
    """True when `tensor` is a contiguous, strided, real-valued CPU tensor (its memory holds exactly its values, in
    order) and memcmp can be called."""
    return (
        tensor.is_cpu
        and tensor.layout is torch.strided
        and not tensor.dtype.is_complex  # a conjugate or negative view's memory is not its values
        and tensor.is_contiguous()
        and _memcmp() is not None
    )


def equal_at(a: Any, a_start: int, b: Any, b_start: int, count: int) -> bool:
    """True when flat elements [a_start, a_start + count) of `a` and [b_start, b_start + count) of `b` hold the same
    bytes; both `plain` and of one element width. ValueError for a range outside either (never read past them)."""
    if count <= 0:
        return True
    if a_start < 0 or b_start < 0 or a_start + count > a.numel() or b_start + count > b.numel():
        raise ValueError(
            f"range outside the tensors: {a_start}+{count} of {a.numel()}, {b_start}+{count} of {b.numel()}"
        )
    width = a.element_size()
    if width != b.element_size():
        raise ValueError(f"element widths differ: {width} and {b.element_size()} bytes")
    return _memcmp()(a.data_ptr() + a_start * width, b.data_ptr() + b_start * width, count * width) == 0


def same_bytes(a: Any, b: Any) -> bool:
    """True when two `plain` tensors hold the same number of bytes, all equal."""
    size = a.nbytes
    if size != b.nbytes:
        return False
    return size == 0 or _memcmp()(a.data_ptr(), b.data_ptr(), size) == 0


def borrowed_bytes(tensor: Any) -> memoryview:
    """A view of a `plain` tensor's bytes for hashing at once: no numpy array or tensor view built. It does not keep
    the tensor alive; use it while the caller holds the tensor, and only to read."""
    size = tensor.nbytes
    if size == 0:
        return memoryview(b"")
    return memoryview(_char_array(size).from_address(tensor.data_ptr()))


@functools.lru_cache(maxsize=256)
def _char_array(size: int) -> Any:
    """The ctypes array type of `size` bytes (a type per size is costly to make; tensors repeat a few sizes)."""
    return ctypes.c_char * size
