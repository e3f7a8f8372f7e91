"""The pure checks of a version folder: the index against the shards, and the manifest against the stored bytes.

Nothing here needs ranks or loads a tensor whole: headers are parsed with convcheck.hf.checkpoint's validation and
digests are streamed one memory-mapped window at a time (convcheck.hf.digest).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from convcheck.ckpt.manifest import VersionManifest
from convcheck.errors import BadInput
from convcheck.hf.checkpoint import Checkpoint, TensorEntry, read_header
from convcheck.hf.digest import tensor_digest
from convcheck.verdict import Finding

FATAL = frozenset({"no-index", "bad-index", "missing-shard", "corrupt-shard", "duplicate", "overlap", "index-mismatch"})
"""Index findings after which the folder cannot be loaded as a checkpoint (the rank comparison is not run)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Structure:
    """What the index check found, and every tensor it could locate (name -> where its bytes are)."""

    findings: tuple[Finding, ...]
    tensors: dict[str, TensorEntry]
    shards: int

    @property
    def loadable(self) -> bool:
        """True when no finding prevents loading the folder as an HF checkpoint."""
        return not any(f.kind in FATAL for f in self.findings)


def check_index(folder: str | Path, index_name: str) -> Structure:
    """Index complete and consistent with the shards: every shard listed exists and every shard on disk is listed,
    each tensor is in exactly one shard, where the index says, with sane sizes and non-overlapping offsets."""
    root = Path(folder)
    index_file = root / index_name
    findings: list[Finding] = []
    try:
        data = json.loads(index_file.read_text())
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError
    except FileNotFoundError:
        return Structure(findings=(_f(index_name, "no-index", f"{index_name} is missing"),), tensors={}, shards=0)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        message = f"{index_name} is not a safetensors index (no weight_map of name -> file)"
        return Structure(findings=(_f(index_name, "bad-index", message),), tensors={}, shards=0)
    listed = sorted(set(weight_map.values()))
    on_disk = sorted(p.name for p in root.glob("*.safetensors"))
    findings += [
        _f(n, "missing-shard", f"named by {index_name}, but the file does not exist")
        for n in listed
        if n not in on_disk
    ]
    findings += [
        _f(n, "unindexed-shard", f"shard file in the folder that {index_name} does not list")
        for n in on_disk
        if n not in listed
    ]
    tensors: dict[str, TensorEntry] = {}
    for shard in on_disk:
        tensors_here, problem = shard_tensors(root / shard)
        if problem is not None:
            findings.append(problem)
            continue
        for name, entry in tensors_here.items():
            if name in tensors:
                findings.append(_f(name, "duplicate", f"in two shards: {tensors[name].file} and {shard}"))
                continue
            tensors[name] = entry
    for name, shard in sorted(weight_map.items()):
        held = tensors.get(name)
        if held is None and shard in on_disk:
            findings.append(_f(name, "index-mismatch", f"{index_name} says it is in {shard}, which does not hold it"))
        elif held is not None and held.file != shard:
            findings.append(_f(name, "index-mismatch", f"{index_name} says {shard}, the tensor is in {held.file}"))
    for name in sorted(set(tensors) - set(weight_map)):
        findings.append(_f(name, "not-in-index", f"stored in {tensors[name].file}, not listed in {index_name}"))
    total = (data.get("metadata") or {}).get("total_size") if isinstance(data.get("metadata"), dict) else None
    stored = sum(e.nbytes for e in tensors.values())
    if isinstance(total, int) and total != stored:
        findings.append(_f(index_name, "total-size", f"metadata.total_size is {total}, the shards hold {stored} bytes"))
    return Structure(findings=tuple(findings), tensors=tensors, shards=len(on_disk))


def shard_tensors(path: Path) -> tuple[dict[str, TensorEntry], Finding | None]:
    """Every tensor of one shard with its absolute data offset; or a corrupt-shard / overlap finding."""
    try:
        header = read_header(path)
        with open(path, "rb") as fh:
            data_start = 8 + struct.unpack("<Q", fh.read(8))[0]
    except BadInput as exc:
        return {}, _f(path.name, "corrupt-shard", str(exc))
    out: dict[str, TensorEntry] = {}
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        spans.append((begin, end, name))
        out[name] = TensorEntry(
            name=name, file=path.name, dtype=entry["dtype"], shape=tuple(entry["shape"]), offset=data_start + begin
        )
    spans.sort()
    for (_, prev_end, prev), (begin, _, name) in zip(spans, spans[1:]):
        if begin < prev_end:
            return {}, _f(
                path.name, "overlap", f"tensor {name!r} starts at byte {begin}, inside {prev!r} (ends {prev_end})"
            )
    return out, None


def check_manifest(folder: str | Path, manifest: VersionManifest, structure: Structure) -> tuple[int, list[Finding]]:
    """(tensors checked, findings): every manifest tensor is stored with its dtype, shape and digest, and nothing else
    is stored."""
    stored = Checkpoint(path=Path(folder), config={}, tensors=structure.tensors)
    findings: list[Finding] = []
    checked = 0
    for name in sorted(manifest.tensors):
        want = manifest.tensors[name]
        entry = structure.tensors.get(name)
        if entry is None:
            findings.append(
                _f(name, "missing", f"listed in the manifest ({want.dtype} {list(want.shape)}), not stored")
            )
            continue
        checked += 1
        if entry.dtype != want.dtype:
            findings.append(_f(name, "dtype", f"stored as {entry.dtype}, the manifest says {want.dtype}"))
        elif entry.shape != want.shape:
            findings.append(_f(name, "shape", f"stored as {list(entry.shape)}, the manifest says {list(want.shape)}"))
        else:
            digest = tensor_digest(stored, name, manifest.hash)
            if digest != want.digest:
                message = f"sha256 of the stored bytes is {digest[:16]}..., the manifest says {want.digest[:16]}..."
                findings.append(_f(name, "digest-differs", message, {"expected": want.digest, "actual": digest}))
    for name in sorted(set(structure.tensors) - set(manifest.tensors)):
        findings.append(_f(name, "not-in-manifest", f"stored in {structure.tensors[name].file}, not in the manifest"))
    return checked, findings


def _f(tensor: str, kind: str, message: str, detail: dict | None = None) -> Finding:
    return Finding(tensor=tensor, kind=kind, message=message, detail=detail or {})
