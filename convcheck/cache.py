"""Where convcheck keeps what it caches (fixtures, layout reference manifests), how to clear it, and what keys a cached
result by content: the source files that were loaded, so a cache never outlives the code that made it."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
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


WATCHED = ("convcheck", "megatron", "transformers", "convcheck_hook_")
"""Top-level packages whose loaded source files key a cached verdict input (hooks load as convcheck_hook_*)."""


def loaded_sources(prefixes: tuple[str, ...] = WATCHED) -> dict[str, str]:
    """{absolute file path: sha256 of its bytes} for every loaded module under `prefixes` that has a source file."""
    out = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefixes):
            continue
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py") or not Path(file).is_absolute():
            continue
        try:
            out[file] = hashlib.sha256(Path(file).read_bytes()).hexdigest()
        except OSError:
            continue
    return dict(sorted(out.items()))


def unchanged(recorded: dict[str, str]) -> bool:
    """True when every recorded file still exists with the same content (and something was recorded)."""
    if not recorded:
        return False
    for file, digest in recorded.items():
        try:
            if hashlib.sha256(Path(file).read_bytes()).hexdigest() != digest:
                return False
        except OSError:
            return False
    return True


def source_snapshot(prefixes: tuple[str, ...] = WATCHED) -> dict[str, tuple[int, int, str]]:
    """{file: (mtime_ns, size, sha256)} of every loaded source file under `prefixes`: what a warm server's forks
    run."""
    out = {}
    for file, digest in loaded_sources(prefixes).items():
        stat = os.stat(file)
        out[file] = (stat.st_mtime_ns, stat.st_size, digest)
    return out


def changed_since(snapshot: dict[str, tuple[int, int, str]]) -> str | None:
    """Why a fork of a warm server holding `snapshot` would no longer run the code on disk (None: it would): the
    first loaded source file whose bytes changed since the server loaded it (hashed again only when its size or mtime
    changed)."""
    for file, (mtime_ns, size, digest) in snapshot.items():
        try:
            stat = os.stat(file)
            if (stat.st_mtime_ns, stat.st_size) == (mtime_ns, size):
                continue
            if hashlib.sha256(Path(file).read_bytes()).hexdigest() == digest:
                continue
        except OSError:
            pass
        return f"{file} changed since the server loaded it"
    return None
