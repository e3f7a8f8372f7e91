"""Idempotence oracle: replaying a full sync (same, reversed and shuffled name order) leaves the receiver unchanged."""

from __future__ import annotations

import random
from typing import Any

from convcheck.compare.bits import bytes_equal, compare_bits
from convcheck.oracles import ORACLES, receiver_vllm
from convcheck.rank.context import RankContext
from convcheck.sync import receive
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "idempotence"
INFO = ORACLES[NAME]
SEED = 0


def _orders(items: list[tuple[str, Any]]) -> list[tuple[str, list[tuple[str, Any]]]]:
    shuffled = list(items)
    random.Random(SEED).shuffle(shuffled)
    return [("same", list(items)), ("reversed", list(reversed(items))), ("shuffled", shuffled)]


def diagnose(before: Any, after: Any) -> str | None:
    """What a replay did to a parameter, when it is a plain transform of the snapshot."""
    transposed = before.dim() == 2 and tuple(after.shape) == (before.shape[1], before.shape[0])
    if transposed and bytes_equal(before.t().contiguous(), after):
        return "transposed by the replay"
    same = tuple(after.shape) == tuple(before.shape) and before.is_floating_point()
    if same and bytes_equal(before + before, after):
        return "accumulated: the replay added onto the state (2x the snapshot)"
    return None


def replay_findings(order: str, snapshot: dict[str, Any], state: dict[str, Any], done: set[str]) -> list[Finding]:
    """Findings for parameters whose state after the `order` replay differs from the snapshot (once per name)."""
    findings = []
    for name in sorted(set(snapshot) | set(state)):
        if name in done:
            continue
        if name not in state or name not in snapshot:
            where = "vanished from" if name not in state else "appeared in"
            finding = Finding(
                tensor=name, kind="not-idempotent", message=f"{where} the receiver on the {order}-order replay"
            )
        else:
            differs = compare_bits(name, snapshot[name], state[name])
            if differs is None:
                continue
            found = diagnose(snapshot[name], state[name])
            message = f"the {order}-order replay changed it: {differs.message}" + (f"; {found}" if found else "")
            detail = {**differs.detail, "replay": order, **({"diagnosis": found} if found else {})}
            finding = Finding(tensor=name, kind="not-idempotent", message=message, detail=detail)
        done.add(name)
        findings.append(finding)
    return findings


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains one export; rank 0 syncs it, snapshots the receiver and replays it three times."""
    if receiver_vllm.wanted(ctx):  # --receiver vllm: a real vLLM engine is the receiver
        return receiver_vllm.idempotence(ctx)
    receiver, failure, uncovered = receive.build(ctx) if ctx.is_reporter else (None, None, None)
    delivery = receive.sync(ctx, receiver, keep=True)
    if not ctx.is_reporter:
        return None
    if uncovered is not None:
        return OracleVerdict(name=NAME, checked=0, unit="parameters", not_covered=uncovered)
    findings = [f for f in (failure, delivery.failure, ctx.export_failure()) if f is not None]
    if receiver is None or delivery.failure is not None:
        return make_verdict(NAME, checked=0, findings=findings, unit="parameters")
    for (name, handed), (_, copy) in zip(delivery.handed, delivery.kept):
        if not bytes_equal(copy, handed) or handed.dtype != copy.dtype:
            findings.append(
                Finding(
                    tensor=name,
                    kind="input-mutated",
                    message="the receiver modified the tensor it was handed (a replay of the same "
                    "buffers would load different values)",
                )
            )
    snapshot = {k: v.detach().clone() for k, v in receive.read_state(receiver).items()}
    done: set[str] = set()
    checked = 0
    for order, items in _orders(delivery.kept):
        try:
            receiver.load_weights((name, tensor.clone()) for name, tensor in items)
        except Exception as exc:  # noqa: BLE001 - a receiver that cannot take a replay is a finding
            findings.append(receive.failed(ctx, f"on the {order}-order replay", exc))
            continue
        findings += replay_findings(order, snapshot, receive.read_state(receiver), done)
        checked += len(snapshot)
    return make_verdict(NAME, checked=checked, findings=findings, unit="parameters")
