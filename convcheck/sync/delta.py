"""Sparse weight deltas in final HF coordinates, and their backend-agnostic wire format (README: "Delta wire format").

A delta lists, per changed tensor, the flat row-major indices whose raw bits changed and the new elements; applying
it writes those bits into a copy of the previous tensor. Everything is compared and written through integer views.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.compare.bits import int_view, tensor_sha256, together

FORMAT = "convcheck-delta"
VERSION = 1
PATCH, REPLACE, REMOVE = "patch", "replace", "remove"


class DeltaError(ValueError):
    """A delta that cannot be applied to the given state, or bytes that are not a delta."""


@dataclass(frozen=True, slots=True)
class DeltaEntry:
    """One tensor's change: patch (indices + values), replace (whole tensor) or remove."""

    name: str
    op: str
    dtype: str
    shape: tuple[int, ...]
    indices: Any
    """1-D int64, strictly increasing flat indices (patch); empty otherwise."""
    values: Any
    """1-D tensor of `dtype`: the new elements at `indices` (patch) or the whole flattened tensor (replace)."""
    base_sha256: str | None = None
    """sha256 of the previous tensor's raw bytes (patch, remove): the applier refuses any other base."""


@dataclass(frozen=True, slots=True)
class Delta:
    """A list of entries, sorted by name."""

    entries: tuple[DeltaEntry, ...] = ()

    @property
    def elements(self) -> int:
        return sum(int(e.values.numel()) for e in self.entries)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _torch_dtype(name: str) -> Any:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise DeltaError(f"unknown dtype {name!r}")
    return dtype


def _flat(tensor: Any) -> Any:
    return tensor.detach().contiguous().reshape(-1)


def build_delta(previous: Mapping[str, Any], new: Mapping[str, Any]) -> Delta:
    """The delta that turns `previous` into `new` (bitwise; a dtype or shape change replaces the whole tensor)."""
    entries = []
    for name in sorted(set(previous) | set(new)):
        if name not in new:
            old = previous[name]
            entries.append(
                DeltaEntry(name, REMOVE, _dtype_name(old), tuple(old.shape), _empty(), _empty(), tensor_sha256(old))
            )
            continue
        tensor = new[name]
        old = previous.get(name)
        if old is None or old.dtype != tensor.dtype or tuple(old.shape) != tuple(tensor.shape):
            entries.append(
                DeltaEntry(
                    name, REPLACE, _dtype_name(tensor), tuple(tensor.shape), _empty(), _flat(tensor).cpu().clone()
                )
            )
            continue
        now, before = together(tensor, old)
        changed = (int_view(before) != int_view(now)).nonzero().reshape(-1)
        if changed.numel():
            values = _flat(tensor)[changed.to(tensor.device)].cpu()
            entries.append(
                DeltaEntry(
                    name, PATCH, _dtype_name(tensor), tuple(tensor.shape), changed.cpu(), values, tensor_sha256(old)
                )
            )
    return Delta(tuple(entries))


def _empty() -> Any:
    return torch.empty(0, dtype=torch.int64)


def apply_delta(state: Mapping[str, Any], delta: Delta) -> dict[str, Any]:
    """A new state: `state` with `delta` applied; touched tensors are patched copies, the others are shared."""
    out = dict(state)
    for entry in delta.entries:
        if entry.op == REPLACE:
            out[entry.name] = entry.values.clone().view(_torch_dtype(entry.dtype)).reshape(entry.shape)
            continue
        if entry.name not in out:
            raise DeltaError(f"{entry.name}: {entry.op} of a tensor the state does not hold")
        base = out[entry.name]
        if entry.base_sha256 is not None and tensor_sha256(base) != entry.base_sha256:
            raise DeltaError(f"{entry.name}: the state's tensor is not the base this delta was built on")
        if entry.op == REMOVE:
            del out[entry.name]
            continue
        if entry.op != PATCH:
            raise DeltaError(f"{entry.name}: unknown op {entry.op!r}")
        if _dtype_name(base) != entry.dtype or tuple(base.shape) != entry.shape:
            raise DeltaError(
                f"{entry.name}: delta for {entry.dtype} {list(entry.shape)}, state holds "
                f"{_dtype_name(base)} {list(base.shape)}"
            )
        numel = math.prod(entry.shape)
        if entry.indices.numel() != entry.values.numel():
            raise DeltaError(f"{entry.name}: {entry.indices.numel()} indices but {entry.values.numel()} values")
        if entry.indices.numel() and (int(entry.indices.min()) < 0 or int(entry.indices.max()) >= numel):
            raise DeltaError(f"{entry.name}: an index lies outside the {numel} elements")
        if entry.indices.numel() > 1 and not bool((entry.indices.diff() > 0).all()):
            raise DeltaError(f"{entry.name}: indices are not strictly increasing")
        patched = base.detach().contiguous().clone()
        bits = int_view(patched)
        bits[entry.indices.to(bits.device)] = int_view(entry.values.to(bits.device))
        out[entry.name] = patched
    return out


def encode(delta: Delta) -> bytes:
    """Wire bytes: u64 little-endian header length, a JSON header, then the index and value buffers it points at."""
    header: dict[str, Any] = {"format": FORMAT, "version": VERSION, "entries": []}
    blobs: list[bytes] = []
    offset = 0
    for entry in delta.entries:
        record: dict[str, Any] = {"name": entry.name, "op": entry.op, "dtype": entry.dtype, "shape": list(entry.shape)}
        if entry.base_sha256 is not None:
            record["base_sha256"] = entry.base_sha256
        for key, tensor in (("indices", entry.indices), ("values", entry.values)):
            raw = int_view(tensor.cpu()).numpy().tobytes() if tensor.numel() else b""
            record[key] = [offset, offset + len(raw)]
            blobs.append(raw)
            offset += len(raw)
        header["entries"].append(record)
    head = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def decode(data: bytes) -> Delta:
    """The Delta that `encode` wrote; DeltaError on anything else."""
    if len(data) < 8:
        raise DeltaError("delta shorter than its 8-byte header length")
    (size,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + size])
    except (ValueError, UnicodeDecodeError):
        raise DeltaError("delta header is not JSON") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise DeltaError(f"not a {FORMAT} version {VERSION} header")
    body = data[8 + size :]
    entries = []
    for record in header["entries"]:
        dtype = _torch_dtype(record["dtype"])
        buffers = []
        for key, kind in (("indices", torch.int64), ("values", dtype)):
            begin, end = record[key]
            if not 0 <= begin <= end <= len(body):
                raise DeltaError(f"{record['name']}: {key} bytes [{begin}, {end}) outside the {len(body)}-byte body")
            raw = torch.frombuffer(bytearray(body[begin:end]), dtype=torch.uint8) if end > begin else None
            buffers.append(raw.view(kind) if raw is not None else torch.empty(0, dtype=kind))
        entries.append(
            DeltaEntry(
                record["name"],
                record["op"],
                record["dtype"],
                tuple(record["shape"]),
                buffers[0],
                buffers[1],
                record.get("base_sha256"),
            )
        )
    return Delta(tuple(entries))
