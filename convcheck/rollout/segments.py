"""Folders of the engine's transport (shared-memory buckets, or the safetensors files of `--engine-transport folder`
under the temporary folder): where they live and the sweep of those a killed run left (no torch: the launcher sweeps
after every launch)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

SHM_ROOT = Path("/dev/shm")
PREFIX = "convcheck-rollout-"
_FOLDER = re.compile(rf"^{PREFIX}(\d+)-")


def shm_root() -> Path:
    """/dev/shm where it exists and is writable, else the temporary folder."""
    return SHM_ROOT if SHM_ROOT.is_dir() and os.access(SHM_ROOT, os.W_OK) else Path(tempfile.gettempdir())


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove bucket folders whose owner (the pid in the name) is gone: what a rank killed outright left."""
    removed = []
    root = shm_root() if root is None else root
    for folder in root.glob(f"{PREFIX}*") if root.is_dir() else ():
        match = _FOLDER.match(folder.name)
        if match is None or alive(int(match.group(1))):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def segment_folder(root: Path | None = None) -> Path:
    """A fresh folder for this process's buckets under `root` (default: shm_root(); the folder transport passes the
    temporary folder), its pid in the name, so a sweep can tell when it is stale."""
    root = shm_root() if root is None else root
    sweep_stale(root)
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
