"""Receiver oracle: one full sync through the chosen sender leaves the receiver bitwise what the source implies."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from convcheck.oracles import ORACLES, receiver_vllm
from convcheck.rank.context import RankContext
from convcheck.sync import receive
from convcheck.verdict import OracleVerdict, make_verdict

NAME = "receiver"
INFO = ORACLES[NAME]


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains the sender's stream; rank 0 syncs it into a fresh receiver and compares."""
    if receiver_vllm.wanted(ctx):  # --receiver vllm: a real vLLM engine is the receiver
        return receiver_vllm.receiver(ctx)
    return check(ctx, lambda: receive.SourceTensors(ctx.checkpoint) if ctx.is_reporter else {})


def check(ctx: RankContext, expected_source: Callable[[], Mapping[str, Any]]) -> OracleVerdict | None:
    """The receiver oracle against `expected_source()` (called on every rank after the sync, so it may be collective;
    rank 0's mapping of HF name -> tensor is what the receiver's expected() reads)."""
    receiver, failure, uncovered = receive.build(ctx) if ctx.is_reporter else (None, None, None)
    if receiver is not None:
        try:
            receive.fill_sentinel(receiver)
        except Exception as exc:  # noqa: BLE001 - a receiver whose tensors cannot be filled is a finding
            receiver, failure = None, receive.failed(ctx, "while its tensors were filled with the sentinel", exc)
    delivery = receive.sync(ctx, receiver)
    source = expected_source()
    if not ctx.is_reporter:
        return None
    if uncovered is not None:
        return OracleVerdict(name=NAME, checked=0, unit="parameters", not_covered=uncovered)
    findings = [f for f in (failure, delivery.failure, ctx.export_failure()) if f is not None]
    if receiver is None or delivery.failure is not None:
        return make_verdict(NAME, checked=0, findings=findings, unit="parameters")
    names = list(source)
    findings += receive.delivery_findings(delivery, names)
    try:
        state = receive.read_state(receiver)
        expected = (
            receiver.expected(source)
            if callable(getattr(receiver, "expected", None))
            else {name: source[name] for name in state if name in source}
        )
    except Exception as exc:  # noqa: BLE001 - a receiver that cannot report its state is a finding
        findings.append(receive.failed(ctx, "while its state or expected() was read", exc))
        return make_verdict(NAME, checked=0, findings=findings, unit="parameters")
    findings += receive.compare_state(receiver, state, expected, names)
    dropped = len(getattr(receiver, "not_held", ()))
    metrics = {"not_held": dropped} if dropped else {}  # MTP tensors no HF parameter holds (HFReceiver.not_held)
    return make_verdict(NAME, checked=len(state), findings=findings, unit="parameters", metrics=metrics)
