"""Shared-memory buckets: how tensors cross from rank 0 to the engine process.

A bucket is one file under a folder in /dev/shm (`segment_folder`), at most `capacity` bytes of raw tensor bytes at
16-byte aligned offsets (a larger tensor goes alone, the file grown for it); its message lists each item's
(name, dtype, shape, offset, nbytes). The engine side copies every item out before it acknowledges, so the writer
reuses the one file for the next bucket.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ALIGN = 16


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


class BucketWriter:
    """Packs (name, tensor) pairs into one bucket file; `message()` describes the full bucket and starts the next."""

    def __init__(self, folder: Path, capacity: int) -> None:
        self.path = folder / "bucket"
        self.capacity = max(int(capacity), ALIGN)
        self.items: list[dict[str, Any]] = []
        self.used = 0
        self._size = 0
        self._map: mmap.mmap | None = None
        self._view: torch.Tensor | None = None
        self.bytes_sent = 0

    def fits(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` fits after what the bucket holds (an empty bucket takes anything)."""
        return not self.items or _aligned(self.used) + _nbytes(tensor) <= self.capacity

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Copy `tensor`'s raw bytes into the bucket (the caller checked `fits`)."""
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        if flat.device.type != "cpu":
            flat = flat.cpu()
        offset = _aligned(self.used)
        self._ensure(offset + flat.numel())
        assert self._view is not None
        self._view[offset : offset + flat.numel()].copy_(flat)
        self.items.append({"name": name, "dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape),
                           "offset": offset, "nbytes": int(flat.numel())})  # fmt: skip
        self.used = offset + flat.numel()
        self.bytes_sent += flat.numel()

    def message(self) -> dict[str, Any]:
        """The `bucket` message for what was added since the last one; the writer starts the next bucket."""
        out = {"op": "bucket", "path": str(self.path), "items": self.items}
        self.items, self.used = [], 0
        return out

    def _ensure(self, size: int) -> None:
        if size <= self._size:
            return
        self.close()
        self._size = max(size, self.capacity)
        with open(self.path, "a+b") as handle:
            handle.truncate(self._size)
            self._map = mmap.mmap(handle.fileno(), self._size, access=mmap.ACCESS_WRITE)
        self._view = torch.frombuffer(self._map, dtype=torch.uint8)

    def close(self) -> None:
        self._view = None
        if self._map is not None:
            self._map.close()
            self._map = None


def read_bucket(message: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """Engine side: every item of a `bucket` message, copied out of the shared file (the writer may reuse it)."""
    items = message["items"]
    if not items:
        return []
    end = max(i["offset"] + i["nbytes"] for i in items)
    with open(message["path"], "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), end, access=mmap.ACCESS_COPY)
    try:
        raw = torch.frombuffer(mapped, dtype=torch.uint8)
        out = []
        for item in items:
            piece = raw[item["offset"] : item["offset"] + item["nbytes"]].clone()
            out.append((item["name"], piece.view(getattr(torch, item["dtype"])).reshape(item["shape"])))
        del raw
    finally:
        mapped.close()
    return out


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


class FileWriter:
    """The folder transport: (name, tensor) pairs written as safetensors files of at most `capacity` bytes each
    (`bucket-NNNNN.safetensors`, a larger tensor alone; a name already in the file being filled starts the next, so a
    tensor sent twice stays twice) into one folder the engine reads when the sync ends."""

    def __init__(self, folder: Path, capacity: int) -> None:
        self.folder = folder
        self.capacity = max(int(capacity), ALIGN)
        self.items: dict[str, torch.Tensor] = {}
        self.used = 0
        self.files = 0
        self.bytes_sent = 0

    def fits(self, name: str, tensor: torch.Tensor) -> bool:
        """Whether (name, tensor) joins the file being filled (an empty one takes anything)."""
        return not self.items or (name not in self.items and self.used + _nbytes(tensor) <= self.capacity)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Keep a CPU copy of `tensor` for the file being filled (the caller checked `fits`)."""
        self.items[name] = tensor.detach().to("cpu", copy=True).contiguous()
        self.used += _nbytes(tensor)
        self.bytes_sent += _nbytes(tensor)

    def flush(self) -> None:
        """Write the file being filled (nothing when empty) and start the next."""
        if not self.items:
            return

        save_file(self.items, str(self.folder / f"bucket-{self.files:05d}.safetensors"))
        self.files += 1
        self.items, self.used = {}, 0


def read_folder(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Engine side: every tensor of the folder transport's files, file by file and name by name."""
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in sorted(handle.keys()):
                yield name, handle.get_tensor(name)


def folder_names(folder: str) -> list[str]:
    """Engine side: the name of every tensor in the folder transport's files (a name in two files twice)."""
    out: list[str] = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            out += sorted(handle.keys())
    return out
