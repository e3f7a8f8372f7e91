"""How the shim tests find their upstream target on any bridge release: on the current pins they check the exact
file:line of SHIMS; in an older release's env (make env BRIDGE=X) they check the upstream function by content, and
a target that release lacks skips the test with the reason."""

from __future__ import annotations

import inspect
from importlib import metadata

import pytest

from convcheck import compat
from convcheck.compat.detect import has_attr, optional_module
from convcheck.gate.release_table import current_release


def release_label() -> str:
    """`megatron-bridge X / megatron-core Y / transformers Z` of this environment."""
    names = ("megatron-bridge", "megatron-core", "transformers")
    return " / ".join(f"{n} {metadata.version(n)}" for n in names)


def on_current_pins() -> bool:
    """True when the installed megatron-bridge is the release of the current pins (convcheck/gate/releases.toml)."""
    return metadata.version("megatron-bridge") == current_release()


def upstream_object(module: str, attribute: str) -> object:
    """`module.attribute` under any convcheck shim; skips the test when this release has no such target."""
    owner = optional_module(module)
    if owner is None or not has_attr(owner, attribute):
        pytest.skip(f"{release_label()} has no {module}.{attribute}: the shim's target is absent")
    for part in attribute.split("."):
        owner = getattr(owner, part)
    return compat.upstream(owner)


def upstream_source(module: str, attribute: str) -> str:
    """Source of upstream `module.attribute` (see upstream_object)."""
    return inspect.getsource(upstream_object(module, attribute))  # type: ignore[arg-type]


def skip_unless(present: bool, what: str) -> None:
    """Skip the test off the current pins when this release lacks `what` (the target of a setting or shim)."""
    if not present:
        pytest.skip(f"{release_label()}: {what} is absent, so the shim or setting is not needed there")
