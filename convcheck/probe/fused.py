"""The differential's per-task work done inside an export drain an earlier oracle runs anyway.

The bridge's export calls each task's real `megatron_to_hf` once; handed tasks whose mapping shells forward that
call to the real mapping and then run the probe on the output (convcheck.probe.collect.task_records), a full drain
leaves the differential's records on the context, and the real conversion is not paid twice. Only a drain that
ran every task, in order, with the task's own weight and module, counts; anything else leaves no records and the
differential collects them itself.
"""

from __future__ import annotations

import copy
import inspect
import time
from typing import Any, Iterable, Iterator

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge import AutoBridge

from convcheck.compare.digest_queue import DigestQueue
from convcheck.probe.collect import keep, task_records, tasks_of, weight_version
from convcheck.probe.hook import export_hook
from convcheck.probe.run import CodeCache
from convcheck.probe.shared import SharedProbes


def usable(bridge: AutoBridge) -> bool:
    """True when the bridge's export takes pre-built conversion tasks and would build none of its own kind."""
    try:
        params = inspect.signature(bridge.export_hf_weights).parameters
    except (TypeError, ValueError):
        return False
    return "conversion_tasks" in params and getattr(bridge, "export_weight_dtype", None) != "fp8"


def shallow_copy(obj: Any, plain: dict[type, bool]) -> Any:
    """copy.copy(obj), without its generic pickling protocol for a plain instance (its class keeps Python's own
    copying, state and slots hooks, and it has a __dict__): a new instance sharing the same attribute values.
    `plain` holds the answer per class for one drain (a class patched between drains is looked at afresh)."""
    cls = type(obj)
    found = plain.get(cls)
    if found is None:
        found = plain[cls] = (
            not hasattr(cls, "__copy__")
            and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
            and not hasattr(cls, "__setstate__")
            and not any(vars(k).get("__slots__") for k in cls.__mro__[:-1])
            and hasattr(obj, "__dict__")
        )
    if not found:
        return copy.copy(obj)
    new = cls.__new__(cls)
    new.__dict__.update(obj.__dict__)
    return new


class ProbeInExport:
    """Tasks for one export drain whose real conversions also produce the differential's records."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.records: list[dict[str, Any]] = []
        self.codes = CodeCache()
        self.shared = SharedProbes()
        self.digests = DigestQueue()
        self.next = 0
        self.seconds = 0.0
        self.intact = True
        tasks = self.bridge_tasks = tasks_of(ctx)
        self.hook = export_hook(ctx, tasks)
        plain: dict[type, bool] = {}
        self.tasks = [self._tapped(i, task, plain) for i, task in enumerate(tasks)]

    def _tapped(self, index: int, task: Any, plain: dict[type, bool]) -> Any:
        """A copy of `task` whose mapping shell calls the real mapping, then records the task."""
        shell = shallow_copy(task.mapping, plain)

        def megatron_to_hf(weights: Any, module: Any) -> Any:
            version = weight_version(task)
            try:
                out = task.mapping.megatron_to_hf(weights, module)
            except Exception:
                self.intact = False  # the export ends here; the differential will run the task itself
                raise
            own = weights is task.param_weight and module is task.megatron_module
            self._record(index, task, out, own_args=own, unwritten=version == weight_version(task))
            return out

        shell.megatron_to_hf = megatron_to_hf
        tapped = shallow_copy(task, plain)  # the task's fields as they are, only the mapping swapped
        object.__setattr__(tapped, "mapping", shell)  # WeightConversionTask is a frozen dataclass
        return tapped

    def _record(self, index: int, task: Any, out: Any, *, own_args: bool, unwritten: bool) -> None:
        if not self.intact or index != self.next or not own_args:
            self.intact = False
            return
        self.next += 1
        started = time.perf_counter()
        real = dict(out or {})
        proven = self.ctx.exports.proven_bytes
        if proven is not None:
            proven.clear()  # the last task's facts: its outputs have streamed by
        self.records.extend(
            task_records(
                self.ctx,
                index,
                task,
                real,
                self.codes,
                with_real=True,
                unwritten=unwritten,
                hook=self.hook,
                shared=self.shared,
                proven=proven,
                digests=self.digests,
            )
        )
        self.seconds += time.perf_counter() - started

    def drain(self, stream: Iterable[Any]) -> Iterator[Any]:
        """Yield the export; once it ends with every task recorded, keep the records on the context. The tapped
        tasks are let go at the end: each one's shell calls back into this object, a cycle that would otherwise leave
        every task, mapping and record of the drain to Python's cyclic collector (tens of thousands of objects)."""
        try:
            yield from stream
            if self.intact and self.next == len(self.tasks):
                started = time.perf_counter()
                self.digests.flush()  # the GPU outputs' cross-rank digests, one wait for the lot
                self.seconds += time.perf_counter() - started
                keep(
                    self.ctx,
                    self.records,
                    with_real=True,
                    origin={"in": self.ctx.phase.removeprefix("oracle "), "seconds": round(self.seconds, 3)},
                    shared=self.shared.shared,
                )
        finally:
            self.tasks = []
            self.digests.drop()
            if self.ctx.exports.proven_bytes is not None:
                self.ctx.exports.proven_bytes.clear()
