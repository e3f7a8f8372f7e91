"""Save one rank's model as a Megatron distributed checkpoint (torch_dist) and restore one, collectively.

The restore fills the fresh model with the NaN sentinel first (as the HF import does, convcheck.rank.model), asks
megatron-core to load with `StrictHandling.RETURN_ALL` and then `load_state_dict`s the result, as a trainer does:
every sharded key that was not restored and every parameter still at the sentinel is reported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import ShardedBase
from megatron.core.dist_checkpointing.validation import StrictHandling

from convcheck.errors import one_line
from convcheck.rank.context import RankContext
from convcheck.rank.model import fill_sentinel, unloaded_counts
from convcheck.verdict import Finding

CHECKPOINT_FORMAT = "torch_dist"
STEP_KEY = "iteration"
"""Common-state key of the training step (the key Megatron-LM trainers write)."""
LAYOUT_KEY = "convcheck_layout"
"""Common-state key of the layout the checkpoint was saved at (informational)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SaveReport:
    """What a save wrote (rank 0's view): sharded keys of every rank, bytes on disk, seconds; or the error."""

    keys: int = 0
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoreReport:
    """What a restore left undone (rank 0's view, every rank merged)."""

    not_restored: tuple[str, ...] = ()
    """Sharded keys the checkpoint holds that nothing at this layout asked for (Megatron's "missing" keys)."""
    not_in_checkpoint: tuple[str, ...] = ()
    """Sharded keys the fresh model asked for that the checkpoint does not hold (Megatron's "unexpected" keys)."""
    sentinel: dict[str, int] = field(default_factory=dict)
    """Global parameter name -> elements still holding the NaN sentinel after the load (summed over ranks)."""
    step: int | None = None
    """The step the checkpoint's common state records (None when it records none)."""
    saved_layout: dict[str, int] | None = None
    keys: int = 0
    seconds: float = 0.0
    error: str | None = None


def model_state(model: list[Any]) -> dict[str, Any]:
    """The model's sharded state dict as trainers nest it: "model" (or "model0", "model1", ... per VP chunk)."""
    if len(model) == 1:
        return {"model": model[0].sharded_state_dict()}
    return {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(model)}


def sharded_keys(state: dict[str, Any]) -> set[str]:
    """The checkpoint keys of every sharded tensor and object in `state` (this rank's)."""
    return {v.key for v in nested_values(state) if isinstance(v, ShardedBase)}


Extra = Callable[[dict[str, Any]], dict[str, Any]]
"""More checkpoint entries built from the model's sharded state (e.g. {"optimizer": ...})."""


def save_checkpoint(
    ctx: RankContext, folder: str | os.PathLike[str], *, step: int | None = None, extra: Extra | None = None
) -> SaveReport:
    """Collective: save the model (and the `extra` entries, e.g. "optimizer") as torch_dist into `folder`."""
    target = Path(folder)
    if ctx.is_reporter:
        target.mkdir(parents=True, exist_ok=True)
    _barrier(ctx)
    started = time.perf_counter()
    error = None
    state = model_state(ctx.model)
    if step is not None:
        state[STEP_KEY] = int(step)
    state[LAYOUT_KEY] = ctx.layout.to_dict()
    if extra is not None:
        state.update(extra(state))
    keys = sharded_keys(state)
    try:
        dist_checkpointing.save(state, str(target))
    except Exception as exc:  # noqa: BLE001 - a failing save is a finding of the oracle, not a crash
        error = one_line(exc)
    seconds = time.perf_counter() - started
    errors = [e for e in ctx.gather(error) if e]
    all_keys = set().union(*ctx.gather(sorted(keys)))
    if dist.is_initialized():
        _barrier(ctx)
    if errors:
        return SaveReport(keys=len(all_keys), seconds=seconds, error=errors[0])
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file()) if ctx.is_reporter else 0
    return SaveReport(keys=len(all_keys), bytes=size, seconds=seconds)


def restore_checkpoint(
    ctx: RankContext, folder: str | os.PathLike[str], *, extra: Extra | None = None
) -> tuple[RestoreReport, dict[str, Any]]:
    """Collective: NaN-fill the model, load `folder` into it as a trainer resumes; the report and the loaded state.

    `extra`: more entries to load with the model (e.g. "optimizer"); their loaded values come back in the state."""
    fill_sentinel(ctx.model)
    started = time.perf_counter()
    state = model_state(ctx.model)
    if extra is not None:
        state.update(extra(state))
    keys = sharded_keys(state)
    loaded: dict[str, Any] = {}
    missing: set[str] = set()
    unexpected: set[str] = set()
    error = None
    try:
        loaded, missing, unexpected = dist_checkpointing.load(state, str(folder), strict=StrictHandling.RETURN_ALL)
        for name, chunk in zip(_chunk_names(ctx.model), ctx.model, strict=True):
            chunk.load_state_dict(loaded[name], strict=False)
    except Exception as exc:  # noqa: BLE001 - a failing load is a finding of the oracle, not a crash
        error = one_line(exc)
    seconds = time.perf_counter() - started
    sentinel = unloaded_counts(ctx.global_name, ctx.model)
    merged: dict[str, int] = {}
    for counts in ctx.gather(sentinel):
        for name, count in counts.items():
            merged[name] = merged.get(name, 0) + count
    errors = [e for e in ctx.gather(error) if e]
    requested = set().union(*ctx.gather(sorted(keys)))
    not_in_ckpt = set().union(*ctx.gather(sorted(unexpected)))
    step = loaded.get(STEP_KEY)
    report = RestoreReport(
        not_restored=tuple(sorted(missing)),
        not_in_checkpoint=tuple(sorted(not_in_ckpt)),
        sentinel=dict(sorted(merged.items())),
        step=int(step) if isinstance(step, int) else None,
        saved_layout=loaded.get(LAYOUT_KEY),
        keys=len(requested),
        seconds=seconds,
        error=errors[0] if errors else None,
    )
    return report, loaded


def _chunk_names(model: list[Any]) -> list[str]:
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


def _barrier(ctx: RankContext) -> None:
    if ctx.world > 1 and dist.is_initialized():
        dist.barrier()


def restore_findings(report: RestoreReport, where: str) -> list[Finding]:
    """One finding per sharded key not restored, per key the checkpoint lacks and per parameter left at the sentinel."""
    findings = []
    if report.error:
        findings.append(
            _finding("<checkpoint>", "load-failed", f"dist_checkpointing.load raised {report.error}", where)
        )
    for key in report.not_restored:
        findings.append(
            _finding(key, "not-restored", "the checkpoint holds this sharded key; nothing restored it", where)
        )
    for key in report.not_in_checkpoint:
        findings.append(
            _finding(key, "not-in-checkpoint", "the fresh model asked for this key; the checkpoint lacks it", where)
        )
    for name, count in report.sentinel.items():
        findings.append(
            _finding(name, "sentinel", f"{count} element(s) still hold the NaN sentinel after the load", where)
        )
    return findings


def relabel(findings: list[Finding] | tuple[Finding, ...], where: str) -> list[Finding]:
    """The same findings, each message prefixed with (and its detail naming) the phase `where` they come from."""
    return [_finding(f.tensor, f.kind, f.message, where, f.detail) for f in findings]


def _finding(tensor: str, kind: str, message: str, where: str, detail: dict[str, Any] | None = None) -> Finding:
    return Finding(tensor=tensor, kind=kind, message=f"{where}: {message}", detail={**(detail or {}), "phase": where})
