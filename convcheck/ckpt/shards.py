"""Write a streamed HF export as safetensors shards plus `model.safetensors.index.json`, one tensor in memory at a time.

Each tensor's raw bytes go to the current shard's data file as they arrive (hashed on the way); a shard is closed
once it reaches the size limit (a tensor never splits) by writing its header and copying the data behind it. The
header pads to a multiple of 8 bytes, tensors are contiguous in arrival order, `__metadata__` is {"format": "pt"}.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convcheck.ckpt.manifest import DEFAULT_MAX_SHARD_BYTES
from convcheck.compare.bits import int_view
from convcheck.errors import BadInput
from convcheck.hf.checkpoint import INDEX_NAME
from convcheck.hf.digest import DigestEntry

_SAFETENSORS_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "int16": "I16", "uint16": "U16", "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32",
    "float32": "F32", "int64": "I64", "uint64": "U64", "float64": "F64",
}  # fmt: skip


def safetensors_dtype(tensor: Any) -> str:
    """The safetensors name (BF16, F32, ...) of a torch tensor's dtype."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in _SAFETENSORS_DTYPES:
        raise BadInput(f"dtype {name} cannot be stored in safetensors")
    return _SAFETENSORS_DTYPES[name]


@dataclass(kw_only=True)
class _Shard:
    data_path: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    size: int = 0


class ShardWriter:
    """Streams (name, tensor) pairs into safetensors shards of at most `max_shard_bytes` each, then writes the index."""

    def __init__(self, folder: str | os.PathLike[str], max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
        self.folder = Path(folder)
        self.max_shard_bytes = max_shard_bytes
        self.digests: dict[str, DigestEntry] = {}
        """Tensor name -> dtype, shape and sha256 of the bytes written."""
        self.duplicates: list[str] = []
        """Names the stream produced more than once (only the first is written)."""
        self._shards: list[_Shard] = []

    def add(self, name: str, tensor: Any) -> None:
        """Append one tensor's raw bytes to the current shard (a new shard when it would pass the limit)."""
        if name in self.digests:
            self.duplicates.append(name)
            return
        flat = tensor.detach().contiguous().reshape(-1)
        if flat.device.type != "cpu":
            flat = flat.cpu()
        raw = memoryview(int_view(flat).numpy()).cast("B")
        shard = self._shards[-1] if self._shards else None
        if shard is None or (shard.size and shard.size + len(raw) > self.max_shard_bytes):
            shard = _Shard(data_path=self.folder / f".shard{len(self._shards) + 1}.data")
            self._shards.append(shard)
        with open(shard.data_path, "ab") as out:
            out.write(raw)
        dtype = safetensors_dtype(tensor)
        shard.entries[name] = {
            "dtype": dtype,
            "shape": list(tensor.shape),
            "data_offsets": [shard.size, shard.size + len(raw)],
        }
        shard.size += len(raw)
        self.digests[name] = DigestEntry(dtype=dtype, shape=tuple(tensor.shape), digest=hashlib.sha256(raw).hexdigest())

    def close(self) -> dict[str, str]:
        """Write every shard file (header, then its data) and the index; return the weight map."""
        count = len(self._shards)
        weight_map: dict[str, str] = {}
        total = 0
        for number, shard in enumerate(self._shards, 1):
            name = f"model-{number:05d}-of-{count:05d}.safetensors"
            write_shard(self.folder / name, shard.entries, shard.data_path)
            shard.data_path.unlink()
            weight_map.update(dict.fromkeys(shard.entries, name))
            total += shard.size
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        return weight_map

    def discard(self) -> None:
        """Remove the data files of shards not yet written."""
        for shard in self._shards:
            shard.data_path.unlink(missing_ok=True)


def write_shard(path: Path, entries: dict[str, dict[str, Any]], data_path: Path) -> None:
    """One safetensors file: 8-byte header length, the JSON header padded to 8 bytes, then the data file's bytes."""
    header = json.dumps({"__metadata__": {"format": "pt"}, **entries}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as out, open(data_path, "rb") as data:
        out.write(struct.pack("<Q", len(header)))
        out.write(header)
        shutil.copyfileobj(data, out, 16 * 1024 * 1024)
