"""`MODULE:FUNC` / `FILE.py:FUNC` specs for callables convcheck runs in every rank: parsed once, loaded late."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from convcheck.errors import BadInput


@dataclass(frozen=True, kw_only=True, slots=True)
class HookSpec:
    """A parsed `target:function`, where target is a module path or a `.py` file."""

    target: str
    function: str

    @property
    def is_file(self) -> bool:
        return self.target.endswith(".py")

    def __str__(self) -> str:
        return f"{self.target}:{self.function}"


def parse_hook(spec: str, *, what: str = "hook") -> HookSpec:
    """Check the form (and that a named file exists) without importing anything; BadInput on a bad spec."""
    target, _, function = spec.rpartition(":")
    if not target or not function.isidentifier():
        raise BadInput(f"{what} {spec!r} is not of the form MODULE:FUNCTION or FILE.py:FUNCTION")
    parsed = HookSpec(target=target, function=function)
    if parsed.is_file and not Path(target).is_file():
        raise BadInput(f"{what} file not found: {target}")
    return parsed


def load_hook(spec: str, *, what: str = "hook") -> Callable[..., Any]:
    """Import the module or file of `spec` and return its function; BadInput names what does not resolve."""
    parsed = parse_hook(spec, what=what)
    if parsed.is_file:
        path = Path(parsed.target)
        module_spec = importlib.util.spec_from_file_location(f"convcheck_hook_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise BadInput(f"{what} file cannot be imported: {parsed.target}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(parsed.target)
        except ImportError as exc:
            raise BadInput(f"{what} {spec!r}: cannot import {parsed.target} ({exc})") from None
    if not hasattr(module, parsed.function):
        raise BadInput(f"{what} {spec!r}: {parsed.target} has no attribute {parsed.function!r}")
    return getattr(module, parsed.function)
