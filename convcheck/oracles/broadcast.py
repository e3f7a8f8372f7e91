"""Broadcast oracle: rank 0 broadcasts every exported tensor in bounded chunks; each other rank reassembles it and
compares it byte for byte with its own read of the source checkpoint."""

from __future__ import annotations

from typing import Any

from convcheck.compare.bits import compare_bits, unravel_index
from convcheck.hf.tensors import TensorReader
from convcheck.oracles import ORACLES
from convcheck.rank.context import RankContext
from convcheck.sync.transport import Channel, chunk_bytes, sync_group
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "broadcast"
INFO = ORACLES[NAME]


def received_finding(received: Any, reader: Any, rank: int) -> Finding | None:
    """None when `received` is complete and bitwise the source tensor of its name; else a finding naming it."""
    name = received.name
    if name not in reader.checkpoint.tensors:
        return Finding(tensor=name, kind="unexpected", message=f"rank {rank} received a tensor the source lacks")
    if not received.complete:
        have, need = received.data.numel(), received.expected_bytes
        item = need // max(1, _numel(received.shape))
        first = list(unravel_index(have // item, received.shape)) if have < need else None
        where = f"; first incomplete element {first}" if first is not None else ""
        return Finding(
            tensor=name,
            kind="truncated" if have < need else "size-mismatch",
            message=f"rank {rank} reassembled {have} of {need} bytes{where}",
            detail={"rank": rank, "received_bytes": have, "expected_bytes": need},
        )
    finding = compare_bits(name, reader.get(name), received.tensor())
    if finding is None:
        return None
    return Finding(
        tensor=name,
        kind=finding.kind,
        message=f"on rank {rank}: {finding.message}",
        detail={**finding.detail, "rank": rank},
    )


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains the sender's stream in step; rank 0 sends each tensor as it comes."""
    if ctx.world < 2:  # prepare() refuses this; a direct call gets a finding
        alone = Finding(
            tensor="<broadcast>", kind="no-receivers", message="the broadcast oracle needs at least 2 ranks"
        )
        return make_verdict(NAME, checked=0, findings=[alone])
    channel = Channel(sync_group(), 0, chunk_bytes(ctx.sync.chunk_mb), device=ctx.device)
    reader = None if ctx.is_reporter else TensorReader(ctx.checkpoint)
    findings: list[Finding] = []
    rows: dict[str, str] = {}
    checked = 0

    def take() -> bool:
        nonlocal checked
        received = channel.recv()
        if received is None:
            return False
        finding = received_finding(received, reader, ctx.rank)
        checked += 1
        rows[received.name] = "fail" if finding is not None else rows.get(received.name, "pass")
        if finding is not None:
            findings.append(finding)
        return True

    ended = False
    for name, tensor in ctx.export():
        if ctx.is_reporter:
            channel.send(name, tensor)
        elif not ended:
            ended = not take()
    if ctx.is_reporter:
        channel.close()
    else:
        while not ended and take():
            pass
    gathered = ctx.gather((checked, [f.to_dict() for f in findings], rows))
    if not ctx.is_reporter:
        return None
    all_findings = [f for f in (ctx.export_failure(),) if f is not None]
    verdicts: dict[str, str] = {}
    for rank_checked, rank_findings, rank_rows in gathered[1:]:
        checked += rank_checked
        all_findings += [Finding.from_dict(f) for f in rank_findings]
        for name, verdict in rank_rows.items():
            verdicts[name] = "fail" if "fail" in (verdict, verdicts.get(name)) else "pass"
    source = ctx.checkpoint.tensors
    table = tuple(
        TensorRow(
            tensor=n,
            shape=source[n].shape if n in source else (),
            dtype=source[n].torch_dtype if n in source else "?",
            verdict=v,
        )
        for n, v in sorted(verdicts.items())
    )
    metrics = {
        "bytes": channel.bytes,
        "chunks": channel.chunks,
        "chunk_mb": ctx.sync.chunk_mb,
        "seconds": round(channel.seconds, 6),
        "GBps": round(channel.bytes / channel.seconds / 1e9, 4) if channel.seconds > 0 else 0.0,
    }
    return make_verdict(NAME, checked=checked, findings=all_findings, rows=table, metrics=metrics)
