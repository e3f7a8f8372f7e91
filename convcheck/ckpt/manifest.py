"""`manifest.json` of a version folder: what was written, at which step and layout, with one digest per tensor.

The tensor part ("hash", "tensors") has the format of a convcheck digest manifest (convcheck/hf/digest.py): per tensor
the safetensors dtype, the shape and the sha256 of the raw stored bytes, one tensor per line, names sorted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convcheck.errors import BadInput
from convcheck.hf.checkpoint import INDEX_NAME
from convcheck.hf.digest import HASH, VERSION_FORMAT, DigestEntry, parse_entries
from convcheck.layout import ParallelLayout

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """Bytes from "5GB", "512MiB", "20KB" or a plain number; BadInput otherwise."""
    cleaned = text.strip().upper()
    digits = cleaned.rstrip("KMGIB")
    unit = cleaned[len(digits) :]
    try:
        value = float(digits)
    except ValueError:
        raise BadInput(f"size {text!r} is not a number with an optional unit (B, KB, MB, GB, KiB, MiB, GiB)") from None
    if unit not in _UNITS or value <= 0:
        raise BadInput(f"size {text!r} is not a positive number with a unit B, KB, MB, GB, KiB, MiB or GiB")
    return int(value * _UNITS[unit])


FORMAT = VERSION_FORMAT
MANIFEST_NAME = "manifest.json"
CHECKPOINT_SUBDIR = "ckpt"


@dataclass(frozen=True, kw_only=True, slots=True)
class VersionManifest:
    """One synced version: the step, the layout of its distributed checkpoint and the digest of every HF tensor."""

    step: int | None
    """Training step both artifacts belong to (None: not recorded)."""
    layout: ParallelLayout
    """Layout the distributed checkpoint was saved at (and the export taken from)."""
    model: str = ""
    """What the model was loaded from (a path or tiny:<name>)."""
    versions: dict[str, str] = field(default_factory=dict)
    checkpoint: str = CHECKPOINT_SUBDIR
    """The torch_dist folder, relative to the version folder."""
    checkpoint_format: str = "torch_dist"
    index: str = INDEX_NAME
    hash: str = HASH
    tensors: dict[str, DigestEntry] = field(default_factory=dict)

    def to_json(self) -> str:
        """The file's text: fixed key order, one tensor per line, names sorted (equal inputs give equal bytes)."""
        head = {
            "format": FORMAT,
            "step": self.step,
            "layout": self.layout.to_dict(),
            "model": self.model,
            "versions": self.versions,
            "checkpoint": {"path": self.checkpoint, "format": self.checkpoint_format},
            "export": {"index": self.index},
            "hash": self.hash,
        }
        lines = [f"    {json.dumps(n)}: {json.dumps(self.tensors[n].to_dict())}" for n in sorted(self.tensors)]
        body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in head.items())
        tensors = "\n" + ",\n".join(lines) + "\n  " if lines else ""
        return f'{{\n{body},\n  "tensors": {{{tensors}}}\n}}\n'


def read_version_manifest(path: str | os.PathLike[str]) -> VersionManifest:
    """Load and validate a version manifest; BadInput names the first defect."""
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise BadInput(f"no {MANIFEST_NAME} in {file.parent} (not a version folder)") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadInput(f"{file} is not valid JSON") from None
    except OSError as exc:
        raise BadInput(f"cannot read {file}: {exc.strerror or exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise BadInput(f"{file} is not a version manifest: format {found!r}, expected {FORMAT!r}")
    step = data.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise BadInput(f"{file}: 'step' must be a non-negative integer or null, got {step!r}")
    layout = _layout(data.get("layout"), file)
    algo = data.get("hash")
    if algo != HASH:
        raise BadInput(f"{file}: unsupported hash {algo!r} (version manifests use {HASH})")
    checkpoint = data.get("checkpoint") or {}
    export = data.get("export") or {}
    if not isinstance(checkpoint, dict) or not isinstance(export, dict):
        raise BadInput(f"{file}: 'checkpoint' and 'export' must be objects")
    entries = parse_entries(data.get("tensors"), algo, file)
    return VersionManifest(
        step=step,
        layout=layout,
        model=str(data.get("model", "")),
        versions={str(k): str(v) for k, v in (data.get("versions") or {}).items()},
        checkpoint=str(checkpoint.get("path", CHECKPOINT_SUBDIR)),
        checkpoint_format=str(checkpoint.get("format", "torch_dist")),
        index=str(export.get("index", INDEX_NAME)),
        hash=algo,
        tensors=entries,
    )


def _layout(raw: Any, file: Path) -> ParallelLayout:
    if not isinstance(raw, dict):
        raise BadInput(f"{file}: 'layout' must be an object such as {{\"tp\": 2}}")
    try:
        return ParallelLayout.from_dict(raw)
    except (BadInput, TypeError, ValueError) as exc:
        raise BadInput(f"{file}: bad 'layout': {exc}") from None
