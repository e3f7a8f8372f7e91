"""Sender and receiver specs: built-in names or `MODULE:NAME` / `FILE.py:NAME`, resolved to callables and classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from convcheck.errors import BadInput, ConvcheckError, one_line
from convcheck.hooks import load_hook

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
READBACK = ("state_dict", "named_parameters")
"""How convcheck reads a receiver's state back, in order of preference."""


def normalize_sender(spec: str | None) -> str | None:
    """None for the bridge's export (also spelled "bridge"), else the spec unchanged."""
    return None if spec in (None, "", BRIDGE) else spec


def _load(spec: str, table: dict[str, str], what: str) -> Any:
    """The object a built-in name or hook-style spec names; BadInput when it does not resolve."""
    target = table.get(spec, spec)
    try:
        return load_hook(target, what=what)
    except ConvcheckError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user module that fails to import is bad input
        raise BadInput(f"{what} {spec!r} cannot be imported: {one_line(exc)}") from None


def load_sender(spec: str) -> Callable[[Any], Any]:
    """The sender function `FUNC(ctx) -> iterator of (hf_name, tensor)` of a built-in name or spec."""
    function = _load(spec, SENDERS, "sender")
    if not callable(function):
        raise BadInput(f"sender {spec!r} is not callable")
    return function


def load_receiver(spec: str | None) -> type:
    """The receiver class of a built-in name or spec: it must have load_weights and a way to read its state back."""
    spec = spec or DEFAULT_RECEIVER
    cls = _load(spec, RECEIVERS, "receiver")
    if not callable(cls):
        raise BadInput(f"receiver {spec!r} is not a class")
    if not callable(getattr(cls, "load_weights", None)):
        raise BadInput(f"receiver {spec!r} has no load_weights(weights) method")
    if not any(callable(getattr(cls, name, None)) for name in READBACK):
        raise BadInput(f"receiver {spec!r} has neither state_dict() nor named_parameters() to read its state back")
    return cls


def check_adapters(sender: str | None, receiver: str | None, chunk_mb: float) -> None:
    """Resolve the specs and check the chunk bound before any rank starts; BadInput names the first problem."""
    if not chunk_mb > 0:
        raise BadInput(f"--chunk-mb must be positive, got {chunk_mb!r}")
    if sender is not None:
        load_sender(sender)
    if receiver is not None:
        load_receiver(receiver)
