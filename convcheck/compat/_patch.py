"""The one way a shim replaces an upstream attribute: wrap it once, keep the original reachable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SHIM_ATTR = "_convcheck_shim"  # on a wrapper: the name of the shim that made it
ORIGINAL_ATTR = "_convcheck_original"  # on a wrapper: the function it wraps


def _current(owner: Any, attr: str) -> Any:
    """owner.attr as stored (a class's own function, not a bound or inherited lookup when it has one)."""
    if isinstance(owner, type) and attr in owner.__dict__:
        return owner.__dict__[attr]
    return getattr(owner, attr)


def shims_on(func: Any) -> list[str]:
    """Names of the convcheck shims wrapped around `func`, outermost first."""
    names = []
    while hasattr(func, SHIM_ATTR):
        names.append(getattr(func, SHIM_ATTR))
        func = getattr(func, ORIGINAL_ATTR)
    return names


def upstream(func: Any) -> Any:
    """The upstream function under every convcheck shim wrapped around `func` (itself when none)."""
    while hasattr(func, SHIM_ATTR):
        func = getattr(func, ORIGINAL_ATTR)
    return func


def _patch(owner: Any, attr: str, make: Callable[[Any], Any], name: str | None = None) -> Any:
    """Set owner.attr to make(current) unless shim `name` (default: make's qualified name) already wraps it; return
    that shim's wrapper. Shims of different names may wrap the same attribute, each once."""
    name = name or f"{make.__module__}.{make.__qualname__}"
    current = _current(owner, attr)
    layer = current
    while hasattr(layer, SHIM_ATTR):
        if getattr(layer, SHIM_ATTR) == name:
            return layer
        layer = getattr(layer, ORIGINAL_ATTR)
    wrapper = make(current)
    setattr(wrapper, SHIM_ATTR, name)
    setattr(wrapper, ORIGINAL_ATTR, current)
    setattr(owner, attr, wrapper)
    return wrapper
