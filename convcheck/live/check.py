"""convcheck.live.check and .digest: collective calls inside the user's job, on its own model, bridge and groups."""

from __future__ import annotations

import contextlib
import gc
import time
from pathlib import Path
from typing import Any, Iterator

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge import AutoBridge

from convcheck.errors import BadInput
from convcheck.hf.digest import Manifest, check_output, write_text_atomic
from convcheck.live.agreement import run_agreed
from convcheck.live.context import live_context
from convcheck.oracles import load_live_oracle, parse_live_names, ride
from convcheck.rank.context import RankContext
from convcheck.rank.export_digests import ExportDigests
from convcheck.rank.export_pass import ExportPass
from convcheck.rank.options import SyncOptions
from convcheck.sync.adapters import Adapter, check_adapters, normalize_sender
from convcheck.verdict import OracleVerdict, Report, complete
from convcheck.versions import versions


def check(
    model: Any,
    bridge: AutoBridge,
    oracles: str | list[str] | tuple[str, ...] | None = None,
    *,
    sender: Adapter | None = None,
    receiver: Adapter | None = None,
    chunk_mb: float = 64.0,
    names_from: str | Path | None = None,
    pg_collection: Any = None,
) -> Report | None:
    """Collective (every rank calls it): run the live oracles (default coverage, differential, mapping) on the job's
    model chunks through its AutoBridge and process groups; rank 0 returns the Report, other ranks None.

    The weights are only read. `sender` / `receiver` are specs as `convcheck verify --sender/--receiver` takes them
    (built-in names or MODULE:NAME) or the function / class itself; `pg_collection` the job's ProcessGroupCollection
    (default: parallel_state's groups). BadInput, the same on every rank before any oracle, for an oracle that needs
    an HF source, a bad adapter, a collection that disagrees, or a job that is not initialised; an oracle raising on
    some ranks only is convcheck.live.LiveFailure on every rank."""
    names = parse_live_names(oracles)
    check_adapters(sender, receiver, chunk_mb, here=True)
    sync = SyncOptions(sender=normalize_sender(sender), receiver=receiver, chunk_mb=chunk_mb)
    with collector_paused():
        return _check(model, bridge, names, names_from, sync, pg_collection)


def _check(
    model: Any, bridge: AutoBridge, names: tuple[str, ...], names_from: Any, sync: SyncOptions, pg_collection: Any
) -> Report | None:
    ctx = live_context(model, bridge, names_from=names_from, sync=sync, pg_collection=pg_collection)
    started = time.perf_counter()
    ride(ctx, names, live=True)  # the differential's probe, the mapping tap: in an earlier drain
    verdicts: list[OracleVerdict] = []
    try:
        for name in names:
            ctx.phase = f"oracle {name}"
            t0 = time.perf_counter()
            verdict = run_agreed(name, lambda: load_live_oracle(name)(ctx))  # noqa: B023 - called at once
            if verdict is not None:
                verdicts.append(_timed(verdict, time.perf_counter() - t0))
    finally:
        ctx.exports = ExportPass()  # the probe records and held tensors go with it
        ctx.names.end_run()  # the walk of the job's tensors too (the names stay for the next check)
    if not ctx.is_reporter:
        return None
    return Report(
        model=f"live:{ctx.checkpoint.architecture}",
        layout=job_layout(ctx),
        device=ctx.device,
        versions=versions(),
        oracles=complete(names, tuple(verdicts)),
        seconds=time.perf_counter() - started,
        device_reason="live: the device of the job's weights",
    )


def job_layout(ctx: RankContext) -> dict[str, int]:
    """The report's layout: the model-parallel layout, and where the job has more ranks than it needs (replicas of the
    model), the data-parallel size `dp` and the job's world size."""
    layout = ctx.layout.to_dict()
    if ctx.world == ctx.layout.world_size or ctx.world % ctx.layout.world_size:
        return layout
    return {**layout, "dp": ctx.world // ctx.layout.world_size, "world_size": ctx.world}


def digest(
    model: Any,
    bridge: AutoBridge,
    *,
    out: str | Path | None = None,
    sender: Adapter | None = None,
    pg_collection: Any = None,
) -> Manifest | None:
    """Collective: the `convcheck-digest/1` manifest of one export of the job's weights (through `sender`, default the
    bridge's own export) on rank 0 (written to `out` when given), None on other ranks; compare it with a receiver's
    folder by `convcheck sweep FOLDER MANIFEST`."""
    target = check_output(out) if out is not None else None
    check_adapters(sender, None, 64.0, here=True)
    ctx = live_context(model, bridge, names_from=None, sync=SyncOptions(sender=normalize_sender(sender)),
                       need_names=sender is not None, pg_collection=pg_collection)  # fmt: skip
    tap = ExportDigests(reporter=ctx.is_reporter, by="digest")
    ctx.exports.add(tap)
    try:
        for _ in ctx.export(cpu=ctx.device != "cuda"):
            pass
    finally:
        tap.close()
    if ctx.export_error:
        raise BadInput(f"live digest: the export raised {ctx.export_error}")
    if not ctx.is_reporter:
        return None
    manifest = tap.manifest()
    if target is not None:
        write_text_atomic(target, manifest.to_json())
        manifest = Manifest(path=target, hash=manifest.hash, tensors=manifest.tensors)
    return manifest


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block and back on after it when it was on: the check makes tens
    of thousands of records at a real model's tensor count, and each full collection would walk the whole job's
    heap (seconds); what the check leaves cyclic is collected after it as usual."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _timed(verdict: OracleVerdict, seconds: float) -> OracleVerdict:
    """The verdict with its seconds, as the worker records them."""
    import dataclasses

    return dataclasses.replace(verdict, seconds=round(seconds, 3))
