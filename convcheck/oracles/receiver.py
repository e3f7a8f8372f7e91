"""Receiver oracle: one full sync through the chosen sender leaves the receiver bitwise what the source implies."""

from __future__ import annotations

from convcheck.oracles.base import OracleInfo
from convcheck.rank.context import RankContext
from convcheck.sync import receive
from convcheck.verdict import OracleVerdict, make_verdict

NAME = "receiver"
INFO = OracleInfo(
    name=NAME,
    proves="after one full sync through the chosen sender (--sender) into the receiver (--receiver, default hf), "
    "built on rank 0 and filled with a NaN sentinel, every receiver parameter is bitwise what the source "
    "checkpoint implies (the receiver's expected(), default: the HF tensor of the same name), nothing is left "
    "unwritten, and every source tensor is delivered exactly once",
    does_not_prove="that the receiver computes correctly with those parameters, or anything about partial syncs; "
    "it trusts the receiver's expected() (the fused receiver's packs by torch.cat, its loader by row offsets)",
    default=False,
)


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains the sender's stream; rank 0 syncs it into a fresh receiver and compares."""
    receiver, failure = receive.build(ctx) if ctx.is_reporter else (None, None)
    if receiver is not None:
        try:
            receive.fill_sentinel(receiver)
        except Exception as exc:  # noqa: BLE001 - a receiver whose tensors cannot be filled is a finding
            receiver, failure = None, receive.failed(ctx, "while its tensors were filled with the sentinel", exc)
    delivery = receive.sync(ctx, receiver)
    if not ctx.is_reporter:
        return None
    findings = [f for f in (failure, delivery.failure, ctx.export_failure()) if f is not None]
    if receiver is None or delivery.failure is not None:
        return make_verdict(NAME, checked=0, findings=findings, unit="parameters")
    source = receive.SourceTensors(ctx.checkpoint)
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
