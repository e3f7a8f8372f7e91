"""Roundtrip oracle: the bridge's HF export of the sharded model is byte-identical to the source checkpoint."""

from __future__ import annotations

from convcheck.oracles import ORACLES
from convcheck.rank.context import RankContext
from convcheck.rank.source_match import compare_to_source, missing_from_export, record_comparison
from convcheck.verdict import OracleVerdict, make_verdict

NAME = "roundtrip"
INFO = ORACLES[NAME]


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains the export (it runs the gathers); rank 0 compares, one tensor at a time. The
    mapping oracle's shard check rides on the source reads (ctx.exports.shard_match); layout and mapping reuse the
    equality."""
    found = compare_to_source(ctx, tap=ctx.exports.shard_match)
    record_comparison(ctx, found, by=NAME)
    if not ctx.is_reporter:
        return None
    missing_from_export(ctx, found)
    rows = tuple(found.rows[n] for n in sorted(found.rows))
    return make_verdict(NAME, checked=found.checked, findings=found.findings, rows=rows)
