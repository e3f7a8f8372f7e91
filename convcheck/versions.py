"""Versions of the components a verdict depends on."""

from __future__ import annotations

import functools
import platform
from importlib import metadata

COMPONENTS = ("convcheck", "torch", "megatron-core", "megatron-bridge", "transformers", "safetensors")


def versions() -> dict[str, str]:
    """Installed version of each component (or "missing"), plus the Python version."""
    return dict(_read())


@functools.cache
def _read() -> dict[str, str]:
    """The versions as this process first reads them (the code it imported then is the code it runs)."""
    out = {}
    for name in COMPONENTS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    out["python"] = platform.python_version()
    return out
