"""An HF checkpoint folder: validated up front in pure Python, then read one tensor at a time."""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convcheck.errors import BadInput
from convcheck.hf.shapes import check_config_shapes

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_MAX_HEADER = 100 * 1024 * 1024
WINDOW = 16 * 1024 * 1024
"""Bytes mapped at a time by mapped_windows (a multiple of 8: every element lies in one window)."""
_DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu", "I16": "int16", "U16": "uint16", "F16": "float16", "BF16": "bfloat16",
    "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64", "U64": "uint64", "F64": "float64",
}  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorEntry:
    """Where one tensor lives and what it is, as the safetensors header says."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    offset: int = -1
    """Byte offset of the tensor's data from the start of its file (-1: not recorded)."""

    @property
    def torch_dtype(self) -> str:
        """The dtype as torch names it (bfloat16, float32, ...)."""
        return _TORCH_NAMES.get(self.dtype, self.dtype.lower())

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data as stored."""
        return math.prod(self.shape) * _DTYPE_SIZES[self.dtype]


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoint:
    """A validated HF checkpoint folder."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, TensorEntry]

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or []
        return archs[0] if archs else "?"

    def names(self) -> list[str]:
        return sorted(self.tensors)


def config_of(model_path: str | Path) -> dict[str, Any] | None:
    """A checkpoint folder's config.json as a dict (None when it has none or it is no JSON object)."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def architecture_of(model_path: str | Path) -> str:
    """The first `architectures` entry of a checkpoint folder's config.json ("?" when it has none or no config)."""
    config = config_of(model_path)
    archs = config.get("architectures") if isinstance(config, dict) else None
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "?"


def read_header(file: Path) -> dict[str, Any]:
    """Parse and check one safetensors header against the file's size; raise BadInput on any defect."""
    return _parse_header(file)[0]


def _parse_header(file: Path) -> tuple[dict[str, Any], int]:
    """read_header's work: the checked header and the file offset where the tensor data starts."""
    _require_regular(file, f"safetensors file {file}")
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) < 8:
                raise BadInput(f"corrupt safetensors file {file}: shorter than its 8-byte header length")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(_MAX_HEADER, size - 8):
                raise BadInput(f"corrupt safetensors file {file}: header length {header_len} exceeds the file")
            header = json.loads(fh.read(header_len), object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise BadInput(f"corrupt safetensors file {file}: the header names {exc.args[0]!r} twice") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(
            f"corrupt safetensors file {file}: header is not valid JSON ({exc.__class__.__name__})"
        ) from None
    except OSError as exc:
        raise BadInput(f"cannot read {file}: {exc.strerror or exc}") from None
    if not isinstance(header, dict):
        raise BadInput(f"corrupt safetensors file {file}: header is not a JSON object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadInput(f"corrupt safetensors file {file}: __metadata__ must map strings to strings")
    ranges = [(*_entry_range(file, name, entry), name) for name, entry in header.items() if name != "__metadata__"]
    _check_ranges(file, ranges, size - 8 - header_len)
    return header, 8 + header_len


class _DuplicateKey(ValueError):
    """A JSON object names one key twice (json.loads would silently keep the last)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry_range(file: Path, name: str, entry: Any) -> tuple[int, int]:
    """The checked [begin, end) data byte range of one header entry; BadInput names the tensor and the defect."""
    where = f"corrupt safetensors file {file}: tensor {name!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise BadInput(f"{where} has a bad header entry (needs dtype, shape and data_offsets)")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPE_SIZES:
        raise BadInput(f"{where} has unknown dtype {dtype!r}; known: {', '.join(_DTYPE_SIZES)}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise BadInput(f"{where} has shape {shape!r}, not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise BadInput(f"{where} has data_offsets {offsets!r}, not two non-negative integers")
    begin, end = offsets
    expected = math.prod(shape) * _DTYPE_SIZES[dtype]
    if end - begin != expected:
        raise BadInput(f"{where} has {end - begin} bytes, needs {expected} ({dtype} {shape})")
    return begin, end


def _check_ranges(file: Path, ranges: list[tuple[int, int, str]], data_size: int) -> None:
    """The tensors' byte ranges must tile the data exactly, as safetensors requires: no overlap, gap or tail."""
    position, previous = 0, None
    for begin, end, name in sorted(ranges):
        if end > data_size:
            raise BadInput(
                f"truncated safetensors file {file}: tensor {name!r} ends at data byte {end}, "
                f"past the {data_size} data bytes the file holds"
            )
        if begin < position:
            raise BadInput(
                f"corrupt safetensors file {file}: tensors {previous!r} and {name!r} overlap "
                f"(data bytes {begin}-{position} are claimed by both)"
            )
        if begin > position:
            raise BadInput(f"corrupt safetensors file {file}: data bytes {position}-{begin} belong to no tensor")
        position, previous = end, name
    if position != data_size:
        raise BadInput(
            f"corrupt safetensors file {file}: {data_size - position} bytes after the last tensor's data "
            f"(the header covers {position} of {data_size} data bytes)"
        )


def _require_regular(path: Path, what: str) -> None:
    """BadInput unless `path` (followed through symlinks) is a regular file: a FIFO would block a read forever."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise BadInput(f"{what} not found") from None
    except OSError as exc:
        raise BadInput(f"cannot read {what}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise BadInput(f"{what} is not a regular file (it is {_kind(mode)})")


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))  # fmt: skip
    return next((label for test, label in kinds if test(mode)), "not a file")


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Validate an HF checkpoint folder (config, index, every shard header) without loading tensors."""
    folder = Path(path)
    if not folder.exists():
        raise BadInput(f"model directory not found: {folder}")
    if not folder.is_dir():
        raise BadInput(f"model path is not a directory: {folder}")
    config_file = folder / "config.json"
    if not config_file.exists():
        raise BadInput(f"no config.json in {folder}")
    _require_regular(config_file, f"config.json in {folder}")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"config.json in {folder} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise BadInput(f"cannot read config.json in {folder}: {exc.strerror or exc}") from None
    if not isinstance(config, dict) or not config.get("architectures"):
        raise BadInput(f"config.json in {folder} names no architecture ('architectures' is missing)")
    archs = config["architectures"]
    if not isinstance(archs, list) or not all(isinstance(a, str) and a for a in archs):
        raise BadInput(f"config.json in {folder}: 'architectures' must be a list of class names, got {archs!r}")

    checkpoint = Checkpoint(path=folder, config=config, tensors=_folder_tensors(folder))
    check_config_shapes(checkpoint.config, checkpoint.tensors)
    return checkpoint


def open_weights(path: str | os.PathLike[str]) -> Checkpoint:
    """Validate safetensors weights that need no config.json: a checkpoint folder or one .safetensors file."""
    target = Path(path)
    if target.is_file():
        tensors = _read_tensors(target.parent, [target.name], None, where=str(target))
        return Checkpoint(path=target.parent, config={}, tensors=tensors)
    if not target.exists():
        raise BadInput(f"not found: {target}")
    if not target.is_dir():
        raise BadInput(f"not a file or folder: {target}")
    return Checkpoint(path=target, config={}, tensors=_folder_tensors(target))


def _folder_tensors(folder: Path) -> dict[str, TensorEntry]:
    """The tensors of a folder's weights: the index's shards, model.safetensors, or every *.safetensors file."""
    index_file = folder / INDEX_NAME
    if index_file.exists():
        weight_map = _weight_map(index_file)
        files = sorted(set(weight_map.values()))
        for name in files:
            if not (folder / name).exists():
                raise BadInput(f"missing shard {name} named by {INDEX_NAME} in {folder}")
    elif (folder / SINGLE_NAME).exists():
        weight_map, files = None, [SINGLE_NAME]
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
        if not files:
            pickled = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
            if pickled:
                raise BadInput(
                    f"no safetensors weights in {folder}, only pickled torch weights ({', '.join(pickled[:3])}); "
                    f"convert them first, e.g. AutoModelForCausalLM.from_pretrained(folder).save_pretrained(out)"
                )
            raise BadInput(f"no safetensors weights in {folder}")
        weight_map = None

    return _read_tensors(folder, files, weight_map)


def _weight_map(index_file: Path) -> dict[str, str]:
    """The index's tensor -> shard map, each shard a file name inside the index's folder."""
    _require_regular(index_file, str(index_file))
    try:
        weight_map = json.loads(index_file.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        raise BadInput(f"{index_file} is not a valid safetensors index (no weight_map)") from None
    except OSError as exc:
        raise BadInput(f"cannot read {index_file}: {exc.strerror or exc}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise BadInput(f"{index_file} is not a valid safetensors index (weight_map must map names to shard files)")
    for name, shard in weight_map.items():
        parts = Path(shard).parts
        if not shard or Path(shard).is_absolute() or ".." in parts:
            raise BadInput(f"{index_file} puts tensor {name!r} in {shard!r}, outside the checkpoint folder")
    return weight_map


def _read_tensors(
    folder: Path, files: list[str], weight_map: dict[str, str] | None, where: str = ""
) -> dict[str, TensorEntry]:
    """Check each file's header (and the index, if any) and list every tensor once."""
    tensors: dict[str, TensorEntry] = {}
    for fname in files:
        header, data_start = _parse_header(folder / fname)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            if name in tensors:
                raise BadInput(f"tensor {name!r} appears in both {tensors[name].file} and {fname}")
            tensors[name] = TensorEntry(
                name=name,
                file=fname,
                dtype=entry["dtype"],
                shape=tuple(entry["shape"]),
                offset=data_start + entry["data_offsets"][0],
            )
    if weight_map is not None:
        for name, fname in weight_map.items():
            if name not in tensors or tensors[name].file != fname:
                raise BadInput(f"{INDEX_NAME} says {name!r} is in {fname}, but that shard does not hold it")
        for name, entry in tensors.items():
            if name not in weight_map:
                raise BadInput(
                    f"shard {entry.file} holds tensor {name!r}, which {INDEX_NAME} in {folder} does not list"
                )
    if not tensors:
        raise BadInput(f"{where} holds no tensors" if where else f"the safetensors files in {folder} hold no tensors")
    return tensors


def dtype_size(dtype: str) -> int | None:
    """Bytes per element of a safetensors dtype name (F32, BF16, ...); None when unknown."""
    return _DTYPE_SIZES.get(dtype)


def mapped_windows(checkpoint: Checkpoint, name: str, window: int = WINDOW) -> Iterator[Any]:
    """Tensor `name`'s stored bytes as read-only memoryviews of up to `window` bytes, each over a memory map of its
    own byte range, unmapped once the caller drops it (memory stays flat however large the checkpoint)."""
    entry = checkpoint.tensors[name]
    if entry.offset < 0:
        raise ValueError(f"no data offset recorded for tensor {name!r}")
    file = checkpoint.path / entry.file
    try:
        with open(file, "rb") as fh:
            for pos in range(0, entry.nbytes, window):
                begin = entry.offset + pos
                length = min(window, entry.nbytes - pos)
                start = begin - begin % mmap.ALLOCATIONGRANULARITY
                mapped = mmap.mmap(
                    fh.fileno(),
                    begin - start + length,
                    flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                    prot=mmap.PROT_READ,
                    offset=start,
                )
                yield memoryview(mapped)[begin - start : begin - start + length]
                del mapped
    except (OSError, ValueError) as exc:  # a shard changed or vanished after it was validated
        raise BadInput(f"cannot read tensor {name!r} from {file}: {exc}") from None
