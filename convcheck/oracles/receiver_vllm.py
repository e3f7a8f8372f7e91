"""`--receiver vllm`: the receiver, idempotence and delta oracles with a real vLLM engine as the receiver.

The engine is the engine oracle's (convcheck.rollout: its own process and environment, $CONVCHECK_ENGINE_PYTHON or
.venv-vllm, shared-memory buckets of --chunk-mb, vLLM's `reload_weights`), started on rank 0 by the first of these
oracles and shared by the others of the run (closed with the run's early work). It loads the source checkpoint with
its own loader first: what it computes with then is the reference.

- receiver: the engine poisoned (every weight sign-flipped through its reload path), one sync of the run's export
  (the chosen --sender); every parameter and packed weight, the prompt logprobs and greedy tokens equal the fresh
  load's, bitwise; every source tensor reaches it exactly once.
- idempotence: one sync, the engine's state and outputs taken as the snapshot, then the same tensors replayed in the
  same, reversed and shuffled order; after each replay everything equals the snapshot, bitwise.
- delta: the delta oracle's planted in-place update (its previous and new exports, the delta through the wire
  format) synced into the engine as the changed tensors, after a full sync of the previous export; the engine must
  then compute bitwise what a second engine's fresh load of the new export (written as a checkpoint over the
  source's tensors) computes.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from convcheck.hf.geometry import Geometry
from convcheck.rank.context import RankContext
from convcheck.rollout import findings as found
from convcheck.sync.adapters import ENGINE_RECEIVER
from convcheck.verdict import Finding, OracleVerdict, make_verdict

VLLM = ENGINE_RECEIVER
SHARED = "receiver-vllm"
"""Key of the shared engine in the run's early work (closed at the end of the run with it)."""
RELOAD = "reload"


def wanted(ctx: RankContext) -> bool:
    """Whether this run's receiver is the engine."""
    return ctx.sync.receiver == VLLM


def _engine(ctx: RankContext) -> tuple[Any, dict[str, Any]]:
    """Rank 0: the run's engine and its fresh-load reference (started and loaded on first use)."""
    from convcheck.rollout.client import EngineHost, engine_timeout, log_path
    from convcheck.rollout.environment import check_python

    shared = ctx.early.get(SHARED)
    if shared is None:
        host = EngineHost(check_python(None), log_path(ctx.workdir), ctx.sync.chunk_mb, engine_timeout(ctx.timeout_s))
        host.start()
        try:
            reference = host.request("start", model=str(ctx.checkpoint.path))
        except BaseException:
            host.close()
            raise
        shared = _Shared(host, reference)
        ctx.early[SHARED] = shared
        ctx.versions.update(reference["versions"])
    return shared.host, shared.reference


class _Shared:
    """The engine the oracles of one run share; `close` (the run's early-work cleanup) stops it."""

    def __init__(self, host: Any, reference: dict[str, Any]) -> None:
        self.host, self.reference = host, reference

    def close(self) -> None:
        self.host.close()


def _drive(
    ctx: RankContext, name: str, drains: int, prepare: Callable[[Any, dict[str, Any]], Any], body: Callable[..., Any]
) -> OracleVerdict | None:
    """Collective: rank 0 brings the engine up and runs `prepare(host, reference)` before any export; once it says
    so, every rank drains the export `drains` times while rank 0 runs `body(host, reference, prepared)`."""
    from convcheck.oracles.engine import engine_fixtures_hint
    from convcheck.rollout.client import EngineCannotRun, EngineFailed

    if not ctx.is_reporter:
        if ctx.gather(None)[0] is None:
            return None
        for _ in range(drains):
            for _ in ctx.export():
                pass
        return None
    agreed = False
    try:
        try:
            host, reference = _engine(ctx)
        except EngineCannotRun as exc:
            reason = f"the engine cannot run this architecture here: {exc.reason}"
            return OracleVerdict(name=name, checked=0, unit="engine tensors", not_covered=reason)
        except EngineFailed as exc:
            raise EngineFailed(f"{exc}{engine_fixtures_hint(ctx.checkpoint.config)}") from None
        prepared = prepare(host, reference)
        ctx.gather("ready")
        agreed = True
        return body(host, reference, prepared)
    finally:
        if not agreed:
            ctx.gather(None)


def _shapes(ctx: RankContext) -> tuple[Geometry, dict[str, Any]]:
    return Geometry.from_hf_config(ctx.checkpoint.config), {n: e.shape for n, e in ctx.checkpoint.tensors.items()}


def _receiver_failed(delivery: dict[str, Any], when: str) -> list[Finding]:
    if not delivery["error"]:
        return []
    err = delivery["error"]
    message = f"vLLM's reload_weights raised {err['error']} at {err['where']} {when}"
    return [Finding(tensor="<receiver>", kind="receiver-failed", message=message)]


def receiver(ctx: RankContext) -> OracleVerdict | None:
    """The receiver oracle into the engine: poison, one sync of the export, every tensor and output against the
    fresh load (the engine oracle's proof, one sync)."""
    from convcheck.oracles.engine import _syncs

    source = str(ctx.checkpoint.path)
    return _drive(
        ctx,
        "receiver",
        1,
        lambda host, _ref: host.request("poison", model=source),
        lambda host, ref, poisoned: _syncs(
            ctx, host, RELOAD, ref, poisoned, name="receiver", whens=("after the sync",)
        ),  # fmt: skip
    )


ORDERS = ("same", "reversed", "shuffled")
SEED = 0


def _ordered(items: list[tuple[str, Any]], order: str) -> list[tuple[str, Any]]:
    if order == "reversed":
        return list(reversed(items))
    if order == "shuffled":
        shuffled = list(items)
        random.Random(SEED).shuffle(shuffled)
        return shuffled
    return list(items)


def idempotence(ctx: RankContext) -> OracleVerdict | None:
    """The idempotence oracle into the engine: one sync, the snapshot, three replays against it."""
    return _drive(ctx, "idempotence", 1, lambda _host, _ref: None, lambda host, _ref, _p: _replays(ctx, host))


def _replays(ctx: RankContext, host: Any) -> OracleVerdict:
    kept: list[tuple[str, Any]] = []

    def keeping() -> Iterator[tuple[str, Any]]:
        for name, tensor in ctx.export():
            kept.append((name, tensor.detach().clone()))
            yield name, tensor

    geometry, shapes = _shapes(ctx)
    first = host.sync(RELOAD, keeping())
    findings = _receiver_failed(first, "on the first sync")
    export = ctx.export_failure()
    if export is not None:
        findings.append(export)
    snapshot = host.request("snapshot")
    done: set[str] = set()
    checked = 0
    for order in ORDERS:
        when = f"on the {order}-order replay"
        delivery = host.sync(RELOAD, iter(_ordered(kept, order)))
        findings += _receiver_failed(delivery, when)
        seen = host.request("inspect")
        diffs = [d for d in seen["diffs"] if d["name"] not in done]
        done |= {d["name"] for d in diffs}
        findings += found.state_findings(diffs, f"{when} (against the state after the first sync)", geometry,
                                         shapes, kind="not-idempotent")  # fmt: skip
        findings += found.output_findings(snapshot["outputs"], seen["outputs"], when)
        checked += len([k for k, (shape, _, _) in snapshot["state"].items() if any(shape)])
    metrics = {"tensors": len(kept), "vllm": ctx.versions.get("vllm", "")}
    return make_verdict("idempotence", checked=checked, findings=findings, unit="engine tensors", metrics=metrics)


@dataclass(frozen=True)
class DeltaSteps:
    """The delta oracle's own steps (convcheck.oracles.delta): the two exports around the planted update (collective;
    rank 0 keeps copies, with the export failures) and the wire-format check."""

    exports: Callable[[RankContext], tuple[dict[str, Any], dict[str, Any], list[Finding]]]
    check: Callable[[dict[str, Any], dict[str, Any]], tuple[list[Finding], dict[str, Any]]]


def delta(ctx: RankContext, steps: DeltaSteps) -> OracleVerdict | None:
    """The delta oracle into the engine (see the module docstring). Every rank exports twice (the planted update in
    between); rank 0 proves the wire format as the delta oracle does, then the engine."""
    if not ctx.is_reporter:
        if ctx.gather(None)[0] is None:
            return None
        steps.exports(ctx)
        return None

    def exports(host: Any, _ref: dict[str, Any], _p: Any) -> OracleVerdict:
        previous, new, findings = steps.exports(ctx)
        wire, metrics = steps.check(previous, new)
        return _delta_into_engine(ctx, host, previous, new, findings + wire, metrics)

    return _drive(ctx, "delta", 0, lambda _host, _ref: None, exports)


def _delta_into_engine(
    ctx: RankContext, host: Any, previous: dict[str, Any], new: dict[str, Any], findings: list[Finding],
    metrics: dict[str, Any],
) -> OracleVerdict:  # fmt: skip
    """Rank 0: the previous export synced in full, then the changed tensors of previous + delta (through the wire
    format); the engine against a second engine's fresh load of the new export."""
    from convcheck.compare.bits import bytes_equal
    from convcheck.rollout.client import EngineHost, engine_timeout, log_path
    from convcheck.rollout.environment import check_python
    from convcheck.sync import delta as wire

    applied = wire.apply_delta(previous, wire.decode(wire.encode(wire.build_delta(previous, new))))
    changed = sorted(n for n in applied if n not in previous or not bytes_equal(previous[n], applied[n]))
    geometry, shapes = _shapes(ctx)
    folder = Path(tempfile.mkdtemp(prefix="convcheck-delta-", dir=ctx.workdir or None))
    try:
        _write_checkpoint(Path(ctx.checkpoint.path), folder / "new", new)
        with EngineHost(check_python(None), log_path(ctx.workdir), ctx.sync.chunk_mb,
                        engine_timeout(ctx.timeout_s)) as fresh:  # fmt: skip
            updated = fresh.request("start", model=str(folder / "new"))
            fresh.request("save", path=str(folder / "reference.pt"))
        full = host.sync(RELOAD, iter(sorted(previous.items())))
        findings += _receiver_failed(full, "on the full sync of the previous export")
        when = f"after a delta sync of {len(changed)} changed tensors"
        sent = host.sync(RELOAD, ((n, applied[n]) for n in changed))
        seen = host.request("inspect", against=str(folder / "reference.pt"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    findings += _receiver_failed(sent, when)
    findings += found.delivery_findings(sent["received"], changed, when)
    findings += found.state_findings(seen["diffs"], when, geometry, shapes, seen["repacked"], kind="delta-differs")
    findings += found.output_findings(updated["outputs"], seen["outputs"], when)
    metrics = {**metrics, "engine_delta": changed, "vllm": ctx.versions.get("vllm", "")}
    checked = len([k for k, (shape, _, _) in updated["state"].items() if any(shape)])
    return make_verdict("delta", checked=checked, findings=findings, unit="engine tensors", metrics=metrics)


def _write_checkpoint(source: Path, out: Path, tensors: dict[str, Any]) -> None:
    """`out`: the source checkpoint's other files (config, tokenizer) and its tensors, those of `tensors` (the new
    export) replacing theirs, as one safetensors file (a tensor the export lacks keeps the source's, so the fresh load
    still has every weight it needs)."""
    from convcheck.rollout.delta import tensors as source_tensors

    tensors = {**dict(source_tensors(source)), **tensors}

    out.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and not path.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy2(path, out / path.name)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
