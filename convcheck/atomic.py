"""Write files through a temporary sibling and a rename, so readers never see half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def _staged(target: Path) -> Path:
    """The temporary sibling `target` is written through (unique per process)."""
    return target.with_name(f".{target.name}.{os.getpid()}.tmp")


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically."""
    target = Path(path)
    tmp = _staged(target)
    try:
        tmp.write_bytes(data)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically."""
    write_bytes_atomic(path, text.encode())


def write_all_atomic(outputs: dict[str, str]) -> None:
    """Write every file of {path: text} or none: all go to temporary siblings first, then each is renamed into place."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in outputs.items():
            target = Path(path)
            staged.append((_staged(target), target))
            staged[-1][0].write_text(text)
        for tmp, target in staged:
            tmp.replace(target)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write `data` as indented JSON to `path` atomically."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
