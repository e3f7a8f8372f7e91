"""Run the bridge's own HF writer (AutoBridge.save_hf_pretrained / save_hf_weights) collectively into a folder, and
record what it was handed: the names its export stream yielded, what it printed, and what it raised."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from convcheck.errors import BadInput, one_line, raised_at
from convcheck.rank.context import RankContext
from convcheck.versions import versions


@dataclass(frozen=True, kw_only=True, slots=True)
class Variant:
    """One call of the bridge's writer: which method, with which options."""

    label: str
    """Short name in findings and metrics, e.g. "save_hf_pretrained" or "save_hf_weights(distributed, n=2)"."""
    method: str
    """"save_hf_pretrained" (config, artifacts and weights) or "save_hf_weights" (weights only)."""
    distributed: bool = False
    every_n: int = 1
    """`save_every_n_ranks` (with distributed_save)."""
    cast: str | None = None
    """The weight_dtype cast ("bf16", "fp16", "fp32"; None: none)."""

    @property
    def folder(self) -> str:
        """The sub-folder the variant writes into (a plain file name)."""
        return self.method + ("-distributed" if self.distributed else "")


def plan(world: int, cast: str | None, offered: frozenset[str]) -> list[Variant]:
    """The writer calls one run proves: save_hf_pretrained on rank 0, then save_hf_weights, with every rank (every
    second rank from 4 ranks up) writing its share of the shards where the layout has several ranks and the bridge
    offers distributed_save (`offered`: the keyword arguments its save_hf_weights takes)."""
    if cast is not None and "weight_dtype" not in offered:
        bridge = versions()["megatron-bridge"]
        raise BadInput(f"--save-dtype: this bridge's save_hf_weights takes no weight_dtype (megatron-bridge {bridge})")
    out = [Variant(label="save_hf_pretrained", method="save_hf_pretrained", cast=cast)]
    if world > 1 and "distributed_save" in offered:
        every = 2 if world >= 4 else 1
        label = f"save_hf_weights(distributed_save, save_every_n_ranks={every})"
        out.append(Variant(label=label, method="save_hf_weights", distributed=True, every_n=every, cast=cast))
    else:
        out.append(Variant(label="save_hf_weights", method="save_hf_weights", cast=cast))
    return out


def offered(bridge: Any) -> frozenset[str]:
    """The keyword arguments the bridge's save_hf_weights takes (distributed_save came in 0.4.0, weight_dtype in
    0.6.0)."""
    import inspect

    return frozenset(inspect.signature(type(bridge).save_hf_weights).parameters)


@dataclass(kw_only=True)
class Written:
    """What one writer call did on this rank."""

    error: str | None = None
    """One line (with where) when the writer raised on this rank."""
    said: list[str] = field(default_factory=list)
    """The warning and error lines the writer printed on this rank (it warns instead of failing in places)."""
    yielded: set[str] = field(default_factory=set)
    """HF names the export stream handed the writer on this rank."""
    seconds: float = 0.0
    skipped: bool = False
    """This rank stopped before writing weights because another rank's writer had raised (not a finding of its own)."""


def write(ctx: RankContext, variant: Variant, folder: Path) -> Written:
    """Collective: call the bridge's writer on every rank into `folder`; what it raised or printed is recorded.

    A writer that raises on one rank only must not leave the others waiting in a collective: the export stream each
    rank started is drained to its end (its gathers stay matched), save_hf_pretrained's weights step starts only
    once every rank got there (rank 0 writes config and tokenizer first, alone), and a rank 0 that raised in a rank-0
    write joins the closing barrier it skipped."""
    out = Written()
    kwargs: dict[str, Any] = {"show_progress": False}
    if variant.distributed:
        kwargs.update(distributed_save=True, save_every_n_ranks=variant.every_n)
    if variant.cast is not None:
        from convcheck.ckpt.written import CAST_DTYPES

        kwargs["weight_dtype"] = getattr(torch, CAST_DTYPES[variant.cast][1])
    printed = io.StringIO()
    streams: list[_Stream] = []
    step = _WeightsStep(ctx, agreed=variant.method != "save_hf_pretrained")
    started = time.perf_counter()
    with _recording(ctx, out.yielded, streams), _stepping(ctx, step), contextlib.redirect_stdout(printed):
        try:
            getattr(ctx.bridge, variant.method)(ctx.model, str(folder), **kwargs)
        except _OtherRankRaised:
            out.skipped = True
        except Exception as exc:  # noqa: BLE001 - a raising writer is a finding
            out.error = f"{one_line(exc)} at {raised_at(exc)}"
        if not step.agreed:
            step.agree(False)  # this rank raised before its weights step: the others must not wait for it
        for stream in streams:
            stream.drain()
        if step.owes_final_barrier(variant.distributed) and not any(stream.failed for stream in streams):
            dist.barrier()
    out.seconds = time.perf_counter() - started
    out.said = [line.strip() for line in printed.getvalue().splitlines() if _worth_saying(line)]
    return out


def _worth_saying(line: str) -> bool:
    text = line.strip()
    return text.startswith(("Warning", "Error", "- ", "  - ")) or "not written" in text or "missing" in text


class _Stream:
    """One export stream handed to the writer: the names it yielded, and what is left of it once the writer stops."""

    def __init__(self, inner: Iterator[tuple[str, Any]], names: set[str]) -> None:
        self.inner, self.names, self.done, self.failed = inner, names, False, False

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        try:
            for name, tensor in self.inner:
                self.names.add(name)
                yield name, tensor
        except GeneratorExit:
            raise
        except BaseException:
            self.failed = self.done = True  # the export itself raised (on every rank, as its gathers do)
            raise
        self.done = True

    def drain(self) -> None:
        """Run the rest of the stream (its collectives) when the writer stopped consuming it early."""
        if not self.done:
            for _ in self.inner:
                pass
            self.done = True


@contextlib.contextmanager
def _swapped(cls: type, name: str, make: Any) -> Iterator[None]:
    """`cls.name` replaced by `make(original)` for the block, then exactly as before (an inherited method is
    inherited again, not copied onto `cls`)."""
    own = name in vars(cls)
    original = getattr(cls, name)
    setattr(cls, name, make(original))
    try:
        yield
    finally:
        if own:
            setattr(cls, name, original)
        else:
            delattr(cls, name)


def _recording(ctx: RankContext, names: set[str], streams: list[_Stream]) -> Any:
    """Record every name the bridge's export stream yields while the writer runs (the writer makes a new model bridge
    per call, so the stream method of its class is wrapped)."""

    def make(original: Any) -> Any:
        def stream(self: Any, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
            streams.append(_Stream(iter(original(self, *args, **kwargs)), names))
            return iter(streams[-1])

        return stream

    return _swapped(type(ctx.bridge._model_bridge), "stream_weights_megatron_to_hf", make)


class _OtherRankRaised(Exception):
    """Raised in place of save_hf_weights on a rank whose peer's save_hf_pretrained raised before that step."""


class _WeightsStep:
    """save_hf_weights as the writer calls it on this rank: whether it raised. Under
    save_hf_pretrained every rank first agrees to start it (rank 0 may have raised writing its artifacts, alone)."""

    def __init__(self, ctx: RankContext, agreed: bool) -> None:
        self.ctx, self.agreed = ctx, agreed
        self.raised = False

    def agree(self, ready: bool) -> bool:
        self.agreed = True
        return all(self.ctx.gather(ready))

    def owes_final_barrier(self, distributed: bool) -> bool:
        """Rank 0 raised inside a rank-0 write (its strict checks run there alone): the other ranks drained their
        streams and wait in save_hf_weights' closing barrier (auto_bridge.py:1203), which this rank skipped. (Not when
        the export stream itself raised: it raises on every rank, and none reaches that barrier.)"""
        return self.raised and not distributed and self.ctx.rank == 0 and self.ctx.world > 1


def _stepping(ctx: RankContext, step: _WeightsStep) -> Any:
    """Wrap the bridge's save_hf_weights for this call: agreement first where asked, then record how it ended."""

    def make(original: Any) -> Any:
        def save_hf_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not step.agreed and not step.agree(True):
                raise _OtherRankRaised
            try:
                return original(self, *args, **kwargs)
            except BaseException:
                step.raised = True
                raise

        return save_hf_weights

    return _swapped(type(ctx.bridge), "save_hf_weights", make)
