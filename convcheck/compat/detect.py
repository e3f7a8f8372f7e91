"""Feature detection for the shims: which upstream target this installed release has, and which shims were skipped
because their target is absent (a skipped shim is not an error: that release does not need it)."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

_SKIPPED: dict[int, str] = {}


def skip(number: int, reason: str) -> None:
    """Record that shim `number` (or one of its sites) was not installed in this process, and why."""
    known = _SKIPPED.get(number)
    _SKIPPED[number] = reason if not known or reason in known else f"{known}; {reason}"


def skipped() -> dict[int, str]:
    """Shim number -> why it was not installed in this process (its target absent in this release)."""
    return dict(_SKIPPED)


def transformer_engine_available() -> bool:
    """True when the real Transformer Engine can be imported (then no TE shim is installed)."""
    return importlib.util.find_spec("transformer_engine") is not None


_TE_FREE = {"on": True}


def te_free() -> bool:
    """True while the shims that build TE-free specs act: TE is missing and the run asked for the local specs (not
    `--spec te`, whose TE stand-in takes their place: convcheck.compat.te_standin)."""
    return _TE_FREE["on"] and not transformer_engine_available()


def set_te_free(on: bool) -> None:
    """Let the installed TE-free spec shims (7, 16, 24) act (True) or run upstream unchanged (False)."""
    _TE_FREE["on"] = bool(on)


def optional_module(name: str) -> ModuleType | None:
    """The module `name`, or None when this release has no such module (any other import error propagates)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise


HYBRID_STACKS = (
    ("megatron.core.models.hybrid.hybrid_block", "HybridStack", "HybridStackSubmodules"),  # megatron-core >= 0.18
    ("megatron.core.ssm.mamba_block", "MambaStack", "MambaStackSubmodules"),  # megatron-core <= 0.17
)
"""Where a release keeps the Mamba hybrid layer stack (module, stack class, submodules class), newest first."""


def hybrid_stack() -> tuple[ModuleType, type, type] | None:
    """(module, stack class, submodules class) of the installed megatron-core's hybrid stack; None when absent."""
    for module_name, stack, submodules in HYBRID_STACKS:
        module = optional_module(module_name)
        if module is not None and hasattr(module, stack):
            return module, getattr(module, stack), getattr(module, submodules)
    return None


def has_attr(owner: Any, path: str) -> bool:
    """True when the dotted attribute `path` exists on `owner`."""
    for part in path.split("."):
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


def site_present(module: ModuleType, path: str) -> bool:
    """True when the dotted attribute `path` exists on `module` and its first name is defined there, not re-exported
    from another module (megatron-core 0.19's ssm/gated_delta_net/__init__.py re-exports gdn.GatedDeltaNet under the
    name the 0.17-0.18 module ssm/gated_delta_net.py defined: the older site is absent there)."""
    if not has_attr(module, path):
        return False
    first = getattr(module, path.split(".")[0])
    return getattr(first, "__module__", module.__name__) == module.__name__
