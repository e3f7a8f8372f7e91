"""What code produced a cached result: the source files that were loaded, by content, so a cache never outlives it."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

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
