"""A custom sender's stream as the oracles see it: items checked, a raising sender turned into a finding."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from convcheck.errors import one_line
from convcheck.sync.adapters import label, load_sender
from convcheck.sync.agree import agree
from convcheck.verdict import Finding

MAX_LISTED = 10
_SENDERS: dict[str, Any] = {}
"""Senders already resolved in this rank (a FILE.py sender is imported once, not once per export)."""


def describe_item(item: Any, known: Any) -> str | None:
    """Why `item` is not a (known HF name, tensor) pair, or None when it is one."""
    if not isinstance(item, tuple) or len(item) != 2:
        return f"{type(item).__name__} instead of a (name, tensor) pair"
    name, tensor = item
    if not isinstance(name, str):
        return f"name of type {type(name).__name__}"
    if not isinstance(tensor, torch.Tensor):
        return f"{name!r}: {type(tensor).__name__} instead of a tensor"
    if name not in known:
        return f"{name!r}: not a tensor of the source checkpoint"
    return None


class Held:
    """A bridge export handed to a custom sender: the sender iterates it, the stream keeps the underlying iterator
    (`ExportPass.held`) so that what a raising sender left of it can still be drained."""

    def __init__(self, ctx: Any, items: Any) -> None:
        self._items = iter(items)
        ctx.exports.held.append(self._items)

    def __iter__(self) -> Held:
        return self

    def __next__(self) -> tuple[str, Any]:
        return next(self._items)


def hold(ctx: Any, items: Any) -> Any:
    """`items` (a bridge export) as the custom sender under way sees it: held (Held) when there is one."""
    return Held(ctx, items) if ctx.sync.sender is not None else items


def _finish_held(ctx: Any, failed: bool) -> None:
    """Drain what the sender left of the bridge exports it started (one fresh export when it failed before starting
    any): the bridge's collectives then match those of ranks whose sender did not fail."""
    if failed and not ctx.exports.held:
        ctx.bridge_export()
    for items in ctx.exports.held:
        try:
            for _ in items:
                pass
        except Exception:  # noqa: BLE001,S110 - the export itself raising on the way is the bridge's, reported as such
            pass


def _close_held(ctx: Any) -> None:
    """Close the held exports (their patches and hashing threads end with them) and forget them."""
    held, ctx.exports.held = ctx.exports.held, []
    for items in held:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _sender(spec: Any) -> Any:
    """The sender function of `spec`: a spec string is loaded once per process, a function given directly is itself."""
    if not isinstance(spec, str):
        return load_sender(spec)
    if spec not in _SENDERS:
        _SENDERS[spec] = load_sender(spec)
    return _SENDERS[spec]


def sender_stream(ctx: Any, cpu: bool = True) -> Iterator[tuple[str, Any]]:
    """Run `ctx.sync.sender` as FUNC(ctx); yield its good items (on the CPU when `cpu`), record the rest on `ctx`.

    A sender that raises on some ranks only: the bridge exports it started are drained there, and every rank ends
    with the same `export_error` (convcheck.sync.agree), so no rank is left in a collective the others skipped."""
    ctx.export_error = None
    ctx.sender_issues = []
    known = ctx.checkpoint.tensors
    count = 0
    error = None
    _close_held(ctx)
    try:
        try:
            items = iter(_sender(ctx.sync.sender)(ctx))
            for item in items:
                problem = describe_item(item, known)
                if problem is not None:
                    ctx.sender_issues.append(f"item {count}: {problem}")
                else:
                    name, tensor = item
                    yield name, tensor.cpu() if cpu and tensor.device.type != "cpu" else tensor
                count += 1
        except Exception as exc:  # noqa: BLE001 - a raising sender is a finding naming it, not a crash
            error = f"{one_line(exc)} (after {count} item(s))"
        _finish_held(ctx, failed=error is not None)
    finally:
        _close_held(ctx)
    ctx.export_error = agree(error)


def sender_failure(ctx: Any) -> Finding | None:
    """`sender-failed` when the sender raised, else `sender-bad-item` when it yielded bad items, else None."""
    issues = list(ctx.sender_issues)
    sender = label(ctx.sync.sender)
    detail: dict[str, Any] = {"sender": sender}
    if issues:
        detail["bad_items"] = issues[:MAX_LISTED]
        detail["bad_item_count"] = len(issues)
    if ctx.export_error:
        also = f"; it also yielded {len(issues)} bad item(s), first: {issues[0]}" if issues else ""
        return Finding(
            tensor="<sender>",
            kind="sender-failed",
            message=f"sender {sender} raised {ctx.export_error}{also}",
            detail=detail,
        )
    if issues:
        shown = "; ".join(issues[:3]) + ("; ..." if len(issues) > 3 else "")
        return Finding(
            tensor="<sender>",
            kind="sender-bad-item",
            message=f"sender {sender} yielded {len(issues)} bad item(s), skipped: {shown}",
            detail=detail,
        )
    return None
