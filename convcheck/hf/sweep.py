"""Byte-identity sweep of two HF checkpoints (or digest manifests), streamed one memory-mapped window at a time."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from convcheck.compare.bits import first_difference
from convcheck.compare.threads import default_threads
from convcheck.errors import BadInput
from convcheck.hf.checkpoint import INDEX_NAME, WINDOW, Checkpoint, TensorEntry, mapped_windows, open_weights
from convcheck.hf.digest import (
    DigestEntry,
    Manifest,
    Progress,
    ordered_map,
    read_manifest,
    storage_order,
    tensor_digest,
)
from convcheck.verdict import FAIL, PASS, Finding

_INT_DTYPES = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Side:
    """One input of a sweep: safetensors weights, or a digest manifest (which knows hashes, not bytes)."""

    label: str
    weights: Checkpoint | None = None
    manifest: Manifest | None = None

    def entries(self) -> dict[str, TensorEntry] | dict[str, DigestEntry]:
        return self.weights.tensors if self.weights is not None else self.manifest.tensors  # type: ignore[union-attr]


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepResult:
    """What a sweep found: findings sorted by tensor then kind, and how much it compared."""

    a: str
    b: str
    findings: tuple[Finding, ...]
    tensors: int
    """Tensors present in both inputs (each compared by dtype and shape, then by bytes or digest)."""
    bytes: int
    """Tensor bytes whose content was compared (counted once, not per side)."""
    bytes_read: int
    """Bytes read from disk, both sides together."""
    a_tensors: int
    b_tensors: int
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        return PASS if self.tensors > 0 and not self.findings else FAIL

    def to_dict(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for f in self.findings:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        return {
            "verdict": self.verdict,
            "a": self.a,
            "b": self.b,
            "counts": {
                "tensors": self.tensors,
                "bytes": self.bytes,
                "bytes_read": self.bytes_read,
                "a_tensors": self.a_tensors,
                "b_tensors": self.b_tensors,
                "findings": len(self.findings),
                "by_kind": kinds,
            },
            "seconds": round(self.seconds, 3),
            "findings": [f.to_dict() for f in self.findings],
        }


def open_side(path: str | os.PathLike[str]) -> Side:
    """A checkpoint folder, a .safetensors file, an index JSON (its folder) or a digest manifest JSON."""
    target = Path(path)
    if target.is_file() and target.suffix == ".json":
        if target.name == INDEX_NAME:
            return Side(label=str(path), weights=open_weights(target.parent))
        return Side(label=str(path), manifest=read_manifest(target))
    return Side(label=str(path), weights=open_weights(target))


def bytes_to_read(a: Side, b: Side) -> int:
    """Bytes a sweep of a and b reads from disk (for deciding whether to show progress)."""
    return sum(_read_cost(a, b, name) for name in _same_kind(a, b))


def sweep(a: str | os.PathLike[str], b: str | os.PathLike[str], workers: int | None = None) -> SweepResult:
    """Compare checkpoint (or manifest) b with reference a, tensor by tensor."""
    return compare(open_side(a), open_side(b), workers=workers)


def compare(a: Side, b: Side, progress: Progress | None = None, workers: int | None = None) -> SweepResult:
    """Missing/extra names, dtype and shape changes, then raw bytes (or digests) of every other common tensor."""
    started = time.perf_counter()
    if a.manifest is not None and b.manifest is not None and a.manifest.hash != b.manifest.hash:
        raise BadInput(f"cannot compare digests: {a.label} uses {a.manifest.hash}, {b.label} {b.manifest.hash}")
    ea, eb = a.entries(), b.entries()
    findings = [_presence(name, "missing", a, b, ea[name]) for name in ea.keys() - eb.keys()]
    findings += [_presence(name, "extra", b, a, eb[name]) for name in eb.keys() - ea.keys()]
    common = ea.keys() & eb.keys()
    findings += [f for name in common if (f := _header_finding(name, ea[name], eb[name])) is not None]
    names = _same_kind(a, b)
    if workers is None and a.weights is not None and b.weights is not None:
        # A byte compare is bound by memory bandwidth, not CPU: on 2 cores one thread measured 3.7 GB/s, two 3.4.
        workers = max(1, default_threads() // 2)
    results = ordered_map(lambda name: _content_finding(name, a, b, progress), names, workers)
    findings += [f for f in results if f is not None]
    return SweepResult(
        a=a.label,
        b=b.label,
        findings=tuple(sorted(findings, key=lambda f: (f.tensor, f.kind, f.message))),
        tensors=len(common),
        bytes=sum(ea[name].nbytes for name in names),
        bytes_read=sum(_read_cost(a, b, name) for name in names),
        a_tensors=len(ea),
        b_tensors=len(eb),
        seconds=time.perf_counter() - started,
    )


def _same_kind(a: Side, b: Side) -> list[str]:
    """Common tensors with equal dtype and shape (their content is compared), in the order the files hold them."""
    ea, eb = a.entries(), b.entries()
    names = [n for n in ea.keys() & eb.keys() if ea[n].dtype == eb[n].dtype and ea[n].shape == eb[n].shape]
    reader = a.weights or b.weights
    return storage_order(reader, names) if reader is not None else sorted(names)


def _read_cost(a: Side, b: Side, name: str) -> int:
    return sum(s.weights.tensors[name].nbytes for s in (a, b) if s.weights is not None)


def _presence(name: str, kind: str, here: Side, there: Side, entry: TensorEntry | DigestEntry) -> Finding:
    """A tensor only one side has: `missing` (in A, not B) or `extra` (in B, not A)."""
    where = "A" if kind == "missing" else "B"
    other = "B" if kind == "missing" else "A"
    return Finding(
        tensor=name,
        kind=kind,
        message=f"in {where} ({here.label}) but not in {other} ({there.label}); {entry.dtype} {list(entry.shape)}",
        detail={"dtype": entry.dtype, "shape": list(entry.shape)},
    )


def _header_finding(name: str, a: TensorEntry | DigestEntry, b: TensorEntry | DigestEntry) -> Finding | None:
    """A dtype or shape change between the two sides' headers (B is compared with reference A)."""
    if a.dtype != b.dtype:
        return Finding(
            tensor=name,
            kind="dtype",
            message=f"dtype {b.dtype}, expected {a.dtype}",
            detail={"expected": a.dtype, "actual": b.dtype},
        )
    if a.shape != b.shape:
        return Finding(
            tensor=name,
            kind="shape",
            message=f"shape {list(b.shape)}, expected {list(a.shape)}",
            detail={"expected": list(a.shape), "actual": list(b.shape)},
        )
    return None


def _content_finding(name: str, a: Side, b: Side, progress: Progress | None) -> Finding | None:
    """Compare one tensor's content: raw bytes when both sides have them, else digests."""
    if a.weights is not None and b.weights is not None:
        return _bytes_finding(name, a.weights, b.weights, progress)
    algo = (a.manifest or b.manifest).hash  # type: ignore[union-attr]
    digest_a, digest_b = _digest(a, name, algo, progress), _digest(b, name, algo, progress)
    if digest_a == digest_b:
        return None
    return Finding(
        tensor=name,
        kind="digest-differs",
        message=f"{algo} {digest_b[:16]}..., expected {digest_a[:16]}... (bytes differ; a digest cannot say where)",
        detail={"hash": algo, "expected": digest_a, "actual": digest_b},
    )


def _digest(side: Side, name: str, algo: str, progress: Progress | None) -> str:
    """The manifest's digest of tensor `name`, or the hash of its stored bytes."""
    if side.manifest is not None:
        return side.manifest.tensors[name].digest
    return tensor_digest(side.weights, name, algo, progress)  # type: ignore[arg-type]


def _bytes_finding(name: str, a: Checkpoint, b: Checkpoint, progress: Progress | None) -> Finding | None:
    """None when the stored bytes are equal; else how many elements differ and the first one, with both values."""
    entry = a.tensors[name]
    numel = math.prod(entry.shape)
    width = entry.nbytes // numel if numel else 1
    count, first, expected, actual = 0, -1, "", ""
    windows_b, start = mapped_windows(b, name, WINDOW), 0
    for view_a in mapped_windows(a, name, WINDOW):  # no zip/enumerate: reused tuples would keep old windows mapped
        wa, wb = np.frombuffer(view_a, dtype=np.uint8), np.frombuffer(next(windows_b), dtype=np.uint8)
        if progress is not None:
            progress(2 * wa.size)
        view = np.dtype(_INT_DTYPES[8 if wa.size % 8 == 0 else 1])
        if not np.array_equal(wa.view(view), wb.view(view)):  # integer views: bitwise, never float semantics
            window_count, k, window_expected, window_actual = _window_diff(entry, wa, wb)
            count += window_count
            if first < 0:
                first, expected, actual = start // width + k, window_expected, window_actual
        start += wa.size
        del wa, wb, view_a  # unmapped before the next window is mapped
    if first < 0:
        return None
    index = [int(i) for i in np.unravel_index(first, entry.shape)] if entry.shape else []
    return Finding(
        tensor=name,
        kind="bytes-differ",
        message=f"{count}/{numel} elements differ; first at index {index}: got {actual}, expected {expected}",
        detail={"count": count, "numel": numel, "first_index": index, "expected": expected, "actual": actual},
    )


def _window_diff(entry: TensorEntry, wa: Any, wb: Any) -> tuple[int, int, str, str]:
    """How many elements of one window differ (integer views of the element width); the first's index and values."""
    dtype = getattr(torch, entry.torch_dtype)
    ta = torch.frombuffer(bytearray(wa), dtype=torch.uint8).view(dtype)
    tb = torch.frombuffer(bytearray(wb), dtype=torch.uint8).view(dtype)
    return first_difference(ta, tb)
