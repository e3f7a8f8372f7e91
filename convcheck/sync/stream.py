"""A custom sender's stream as the oracles see it: items checked, a raising sender turned into a finding."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from convcheck.errors import one_line
from convcheck.sync.adapters import load_sender
from convcheck.verdict import Finding

MAX_LISTED = 10
_SENDERS: dict[str, Any] = {}
"""Senders already resolved in this rank (a FILE.py sender is imported once, not once per export)."""


def describe_item(item: Any, known: Any) -> str | None:
    """Why `item` is not a (known HF name, tensor) pair, or None when it is one."""
    import torch

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


def sender_stream(ctx: Any, cpu: bool = True) -> Iterator[tuple[str, Any]]:
    """Run `ctx.sync.sender` as FUNC(ctx); yield its good items (on the CPU when `cpu`), record the rest on `ctx`."""
    ctx.export_error = None
    ctx.sender_issues = []
    known = ctx.checkpoint.tensors
    count = 0
    try:
        if ctx.sync.sender not in _SENDERS:
            _SENDERS[ctx.sync.sender] = load_sender(ctx.sync.sender)
        items = iter(_SENDERS[ctx.sync.sender](ctx))
        for item in items:
            problem = describe_item(item, known)
            if problem is not None:
                ctx.sender_issues.append(f"item {count}: {problem}")
            else:
                name, tensor = item
                yield name, tensor.cpu() if cpu and tensor.device.type != "cpu" else tensor
            count += 1
    except Exception as exc:  # noqa: BLE001 - a raising sender is a finding naming it, not a crash
        ctx.export_error = f"{one_line(exc)} (after {count} item(s))"


def sender_failure(ctx: Any) -> Finding | None:
    """`sender-failed` when the sender raised, else `sender-bad-item` when it yielded bad items, else None."""
    issues = list(ctx.sender_issues)
    detail: dict[str, Any] = {"sender": ctx.sync.sender}
    if issues:
        detail["bad_items"] = issues[:MAX_LISTED]
        detail["bad_item_count"] = len(issues)
    if ctx.export_error:
        also = f"; it also yielded {len(issues)} bad item(s), first: {issues[0]}" if issues else ""
        return Finding(
            tensor="<sender>",
            kind="sender-failed",
            message=f"sender {ctx.sync.sender} raised {ctx.export_error}{also}",
            detail=detail,
        )
    if issues:
        shown = "; ".join(issues[:3]) + ("; ..." if len(issues) > 3 else "")
        return Finding(
            tensor="<sender>",
            kind="sender-bad-item",
            message=f"sender {ctx.sync.sender} yielded {len(issues)} bad item(s), skipped: {shown}",
            detail=detail,
        )
    return None
