"""Write files through a temporary sibling and a rename, so readers never see half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically (the temporary name is unique per process)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write `data` as indented JSON to `path` atomically."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
