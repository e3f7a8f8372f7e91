"""Sender and receiver specs: built-in names or `MODULE:NAME` / `FILE.py:NAME`, resolved to callables and classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from convcheck.errors import BadInput, ConvcheckError, one_line
from convcheck.hooks import load_hook, problems_elsewhere

BRIDGE = "bridge"
"""The default sender: the bridge's own export_hf_weights (stored as None in a Job)."""
SENDERS: dict[str, str] = {
    "bucketed": "convcheck.sync.senders:bucketed",
    "broadcast": "convcheck.sync.senders:broadcast",
}
RECEIVERS: dict[str, str] = {
    "hf": "convcheck.sync.receivers:HFReceiver",
    "fused": "convcheck.sync.receivers:FusedReceiver",
}
DEFAULT_RECEIVER = "hf"
ENGINE_RECEIVER = "vllm"
"""`--receiver vllm`: a real vLLM engine in its own process (convcheck.oracles.receiver_vllm), not a class here."""
READBACK = ("state_dict", "named_parameters")
"""How convcheck reads a receiver's state back, in order of preference."""


Adapter = str | Callable[..., Any]
"""A sender or receiver as given: a spec (built-in name, `MODULE:NAME`, `FILE.py:NAME`) or the object itself (live)."""


def normalize_sender(spec: Adapter | None) -> Adapter | None:
    """None for the bridge's export (also spelled "bridge"), else the spec (or callable) unchanged."""
    return None if spec is None or (isinstance(spec, str) and spec in ("", BRIDGE)) else spec


def label(adapter: Adapter) -> str:
    """How reports name a sender or receiver: its spec, or `module:qualname` of an object given directly."""
    if isinstance(adapter, str):
        return adapter
    name = getattr(adapter, "__qualname__", None) or type(adapter).__qualname__
    return f"{getattr(adapter, '__module__', None) or type(adapter).__module__}:{name}"


def _load(spec: Adapter, table: dict[str, str], what: str) -> Any:
    """The object a built-in name or hook-style spec names (an object given directly: itself); BadInput when it does
    not resolve."""
    if not isinstance(spec, str):
        return spec
    target = table.get(spec, spec)
    try:
        return load_hook(target, what=what)
    except ConvcheckError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user module that fails to import is bad input
        raise BadInput(f"{what} {spec!r} cannot be imported: {one_line(exc)}") from None


def load_sender(spec: Adapter) -> Callable[[Any], Any]:
    """The sender function `FUNC(ctx) -> iterator of (hf_name, tensor)` of a built-in name or spec, or the callable
    itself."""
    function = _load(spec, SENDERS, "sender")
    if not callable(function):
        raise BadInput(f"sender {label(spec)!r} is not callable")
    return function


def load_receiver(spec: Adapter | None) -> type:
    """The receiver class of a built-in name or spec, or the class (any callable `(config=...)`) itself: it must have
    load_weights and a way to read its state back."""
    spec = spec or DEFAULT_RECEIVER
    cls = _load(spec, RECEIVERS, "receiver")
    name = label(spec)
    if not callable(cls):
        raise BadInput(f"receiver {name!r} is not a class")
    if not callable(getattr(cls, "load_weights", None)):
        raise BadInput(f"receiver {name!r} has no load_weights(weights) method")
    if not any(callable(getattr(cls, method, None)) for method in READBACK):
        raise BadInput(f"receiver {name!r} has neither state_dict() nor named_parameters() to read its state back")
    return cls


def check_adapters(sender: Adapter | None, receiver: Adapter | None, chunk_mb: float, *, here: bool = False) -> None:
    """Check the specs resolve and the chunk bound before any rank starts; BadInput names the first problem. A spec
    naming user code is imported in a child process (the launcher side imports no torch), or `here` (a live check,
    already inside a rank); built-in names are known good; objects given directly are checked as they are."""
    if not chunk_mb > 0:
        raise BadInput(f"--chunk-mb must be positive, got {chunk_mb!r}")
    for kind, spec, table, load in (("sender", sender, SENDERS, load_sender), ("receiver", receiver, RECEIVERS,
                                                                               load_receiver)):  # fmt: skip
        if spec is None or (isinstance(spec, str) and spec in table):
            continue
        if here or not isinstance(spec, str):
            load(spec)
        elif problem := problems_elsewhere(kind, [spec]).get(spec):
            raise BadInput(problem)
