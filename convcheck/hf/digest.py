"""Digest manifests: one hash of the raw stored bytes per tensor, with its dtype and shape, as a small JSON file."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convcheck import atomic
from convcheck.compare.threads import default_threads
from convcheck.errors import BadInput
from convcheck.hf.checkpoint import Checkpoint, dtype_size, mapped_windows, open_weights

FORMAT = "convcheck-digest/1"
VERSION_FORMAT = "convcheck-version/1"
"""A version folder's manifest.json (convcheck/ckpt/manifest.py): its "hash" and "tensors" read as a digest's."""
HASH = "sha256"
# Chosen by measurement (bench/bench_sweep.py, one thread over 1 GB of bf16 tensors from the page cache, 2-core Xeon
# with SHA-NI shared with other jobs, 2026-11-30): sha256 705 MB/s, blake2b 681, sha1 647, sha512 451, md5 326,
# blake2s 280, sha3_256 255 (crc32 993, not collision-resistant). sha256 is the fastest collision-resistant choice
# here, and the hash the layout oracle already uses.
_SUPPORTED = frozenset(hashlib.algorithms_guaranteed) - {"shake_128", "shake_256"}

Progress = Callable[[int], None]
"""Called with the number of bytes just read (from worker threads)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DigestEntry:
    """One tensor as a manifest records it: safetensors dtype name, shape and hex digest of its stored bytes."""

    dtype: str
    shape: tuple[int, ...]
    digest: str

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data as stored."""
        return math.prod(self.shape) * (dtype_size(self.dtype) or 0)

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "digest": self.digest}


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """A digest manifest: the hash algorithm and one DigestEntry per tensor name."""

    path: Path | None
    hash: str
    tensors: dict[str, DigestEntry]

    def to_json(self) -> str:
        """The manifest file's text: one tensor per line, names sorted (equal inputs give equal bytes)."""
        lines = [f"  {json.dumps(n)}: {json.dumps(self.tensors[n].to_dict())}" for n in sorted(self.tensors)]
        head = f'{{"format": {json.dumps(FORMAT)}, "hash": {json.dumps(self.hash)}, "tensors": {{'
        return head + ("\n" + ",\n".join(lines) + "\n" if lines else "") + "}}\n"


def ordered_map[T, R](fn: Callable[[T], R], items: Iterable[T], workers: int | None = None) -> Iterator[R]:
    """fn over items on a thread pool (hashlib and numpy release the GIL), results in input order."""
    count = workers or default_threads()
    if count == 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="convcheck-sweep") as pool:
        yield from pool.map(fn, items)


def storage_order(checkpoint: Checkpoint, names: Iterable[str]) -> list[str]:
    """names sorted by file and offset, so that each shard is read front to back."""
    return sorted(names, key=lambda n: (checkpoint.tensors[n].file, checkpoint.tensors[n].offset))


def tensor_digest(checkpoint: Checkpoint, name: str, algo: str = HASH, progress: Progress | None = None) -> str:
    """Hex digest of tensor `name`'s raw bytes exactly as stored, read memory-mapped one window at a time."""
    hasher = hashlib.new(algo)
    for window in mapped_windows(checkpoint, name):
        hasher.update(window)
        if progress is not None:
            progress(window.nbytes)
        del window  # unmapped before the next window is mapped
    return hasher.hexdigest()


def digest_weights(
    checkpoint: Checkpoint, algo: str = HASH, progress: Progress | None = None, workers: int | None = None
) -> Manifest:
    """A Manifest of every tensor of `checkpoint` (hashed in storage order, several tensors at a time)."""
    names = storage_order(checkpoint, checkpoint.tensors)
    digests = ordered_map(lambda n: tensor_digest(checkpoint, n, algo, progress), names, workers)
    entries = {}
    for name, digest in zip(names, digests, strict=True):
        entry = checkpoint.tensors[name]
        entries[name] = DigestEntry(dtype=entry.dtype, shape=entry.shape, digest=digest)
    return Manifest(path=None, hash=algo, tensors=entries)


def check_output(out: str | os.PathLike[str]) -> Path:
    """The output file `out`, after checking that its folder exists and that it is not a folder itself."""
    target = Path(out)
    if target.is_dir():
        raise BadInput(f"output path is a folder: {target}")
    if not target.resolve().parent.is_dir():
        raise BadInput(f"output folder does not exist: {target.parent}")
    return target


def write_text_atomic(target: Path, text: str) -> None:
    """convcheck.atomic.write_text_atomic; BadInput naming the file when it cannot be written."""
    try:
        atomic.write_text_atomic(target, text)
    except OSError as exc:
        raise BadInput(f"cannot write {target}: {exc.strerror or exc}") from None


def write_digest(
    src: str | os.PathLike[str] | Checkpoint,
    out: str | os.PathLike[str],
    progress: Progress | None = None,
    workers: int | None = None,
) -> Manifest:
    """Hash every tensor of `src` (a checkpoint folder or .safetensors file) and write the manifest to `out`."""
    target = check_output(out)
    checkpoint = src if isinstance(src, Checkpoint) else open_weights(src)
    manifest = digest_weights(checkpoint, HASH, progress, workers)
    write_text_atomic(target, manifest.to_json())
    return Manifest(path=target, hash=manifest.hash, tensors=manifest.tensors)


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Load and validate a digest manifest, or the tensor part of a version folder's manifest.json; BadInput names
    the first defect."""
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadInput(f"{file} is not a convcheck digest manifest: not valid JSON") from None
    except OSError as exc:
        raise BadInput(f"cannot read {file}: {exc.strerror or exc}") from None
    if not isinstance(data, dict) or data.get("format") not in (FORMAT, VERSION_FORMAT):
        found = data.get("format") if isinstance(data, dict) else None
        raise BadInput(f"{file} is not a convcheck digest manifest: format {found!r}, expected {FORMAT!r}")
    algo = data.get("hash")
    if algo not in _SUPPORTED:
        raise BadInput(f"{file}: unsupported hash {algo!r} (supported: {', '.join(sorted(_SUPPORTED))})")
    return Manifest(path=file, hash=algo, tensors=parse_entries(data.get("tensors"), algo, file))


def parse_entries(tensors: Any, algo: str, file: Path) -> dict[str, DigestEntry]:
    """The "tensors" object of a digest or version manifest as DigestEntry per name; BadInput on the first defect."""
    if not isinstance(tensors, dict) or not tensors:
        raise BadInput(f"{file}: 'tensors' must be a non-empty object")
    hex_len = 2 * hashlib.new(algo).digest_size
    entries = {}
    for name, raw in tensors.items():
        entry = _entry(raw, hex_len)
        if entry is None:
            raise BadInput(f"{file}: bad entry for tensor {name!r} (needs dtype, shape and a {algo} hex digest)")
        entries[name] = entry
    return entries


def _entry(raw: Any, hex_len: int) -> DigestEntry | None:
    """A DigestEntry from one manifest record, or None when any field is malformed."""
    if not isinstance(raw, dict):
        return None
    dtype, shape, digest = raw.get("dtype"), raw.get("shape"), raw.get("digest")
    if not isinstance(dtype, str) or dtype_size(dtype) is None:
        return None
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return None
    if not isinstance(digest, str) or len(digest) != hex_len or digest.strip("0123456789abcdef"):
        return None
    return DigestEntry(dtype=dtype, shape=tuple(shape), digest=digest)
