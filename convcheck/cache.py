"""Where convcheck keeps what it caches (fixtures, layout reference manifests), and how to clear it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def cache_root() -> Path:
    """$CONVCHECK_CACHE_DIR, else $XDG_CACHE_HOME/convcheck, else ~/.cache/convcheck."""
    env = os.environ.get("CONVCHECK_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "convcheck"


def cache_dir(kind: str) -> Path:
    """The sub-folder for one kind of cached thing (created on first use)."""
    path = cache_root() / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def clear_cache() -> Path:
    """Remove everything convcheck cached; returns the folder that was cleared."""
    root = cache_root()
    if root.is_dir():
        shutil.rmtree(root)
    return root
