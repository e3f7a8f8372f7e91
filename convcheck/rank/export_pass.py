"""ExportPass: one run's export, drained by the oracles, feeding the consumers the selected oracles declare.

Several oracles need the same expensive pass over the bridge's export; an oracle that declares it rides on an earlier
one's work (OracleInfo.rides_on) sets up its consumer on the run's pass before the first oracle runs (its module's
`ride(ctx)`, called by convcheck.oracles.ride), and does its work inside the first drain that has what it needs:

- export consumers (the gate manifest's digests, the live digest, the live mapping tap) are fed every export stream
  with `start()`, `consume(name, tensor)` per item (`tensor` the HF tensor the stream yields, any shape), and
  `finish(error)` once the stream ran to its end (`error`: one line when the export raised, else None);
- the differential's probe (`probe_pending`) goes into the next full bridge export (convcheck.probe.fused);
- the mapping oracle's shard check (`shard_match`) rides on roundtrip's source reads (convcheck.rank.shard_match).

What the pass leaves for later oracles lives here too: the probe records and where they were made (`probe`), the
bridge's conversion tasks of the probed drain (`export_tasks`), the byte ranges the differential proved inside it
(`proven_bytes`), the export-vs-source answer (`source_match`), and the bridge exports a custom sender holds (`held`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from convcheck.compare.proven import ProvenBytes
from convcheck.probe import fused
from convcheck.probe.collect import ProbeRecords
from convcheck.sync.stream import hold


class Consumer(Protocol):
    """What an export stream feeds, in this order: `start()`, `consume(name, tensor)` per item, `finish(error)` when
    the stream ran to its end."""

    def start(self) -> None: ...

    def consume(self, name: str, tensor: torch.Tensor) -> None: ...

    def finish(self, error: str | None) -> None: ...


@dataclass(kw_only=True)
class ExportPass:
    """One run's export pass: the consumers fed by every export stream and what the drains leave for later oracles."""

    consumers: list[Consumer] = field(default_factory=list)
    """Fed by every export stream, in the order added."""
    probe_pending: bool = False
    """The next full bridge export also produces the differential's records (convcheck.probe.fused)."""
    shard_match: Any = None
    """The mapping oracle's shard tap (convcheck.rank.shard_match.ShardTap: roundtrip's source reads feed it;
    convcheck.oracles.mapping_live.LiveShardTap: an export consumer too), or None."""
    source_match: Any = None
    """This run's export-vs-source answer once a drain recorded it (convcheck.rank.source_match.SourceMatch)."""
    probe: ProbeRecords | None = None
    """The probe's records once an export drain or the differential made them (convcheck.probe.collect.keep)."""
    export_tasks: list[Any] | None = None
    """The bridge's conversion tasks the probed export drain was handed: their mappings are the registry's answers
    for this rank's parameters, which coverage then need not look up again."""
    proven_bytes: ProvenBytes | None = None
    """Byte ranges the differential's compare inside an export drain proved equal for the task being exported, which
    the live mapping tap then need not read again (convcheck.compare.proven); None: nobody would look them up."""
    held: list[Iterator[Any]] = field(default_factory=list)
    """The bridge exports a custom sender is iterating (convcheck.sync.stream.Held): drained if the sender raises."""

    @property
    def probes_shared(self) -> int:
        """Tasks of the held probe records that took shared probe slots (0 when none are held)."""
        return self.probe.shared if self.probe is not None else 0

    def add(self, consumer: Consumer) -> Consumer:
        """Feed `consumer` every export stream from now on; returns it."""
        self.consumers.append(consumer)
        return consumer

    def feed(self, items: Iterable[tuple[str, torch.Tensor]], error: Callable[[], str | None]) -> Iterator[Any]:
        """Yield `items` (an export stream), feeding each to the consumers; once it ends, finish them with `error()`
        (the stream's one-line error, known only then). A consumer that raises ends the stream with its exception,
        noted with the consumer and the step."""
        consumers = list(self.consumers)
        for consumer in consumers:
            _call(consumer, "start")
        for name, tensor in items:
            for consumer in consumers:
                _call(consumer, "consume", name, tensor)
            yield name, tensor
        failed = error()
        for consumer in consumers:
            _call(consumer, "finish", failed)

    def bridge(self, ctx: Any, cpu: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """The bridge's `export_hf_weights` stream for `ctx` (a RankContext); the first one after the differential
        asked for it carries the probe (convcheck.probe.fused). Held for a custom sender under way."""
        if not self.probe_pending or not fused.usable(ctx.bridge):
            return hold(ctx, ctx.bridge.export_hf_weights(ctx.model, cpu=cpu, show_progress=False))
        self.probe_pending = False  # one drain carries the probe
        probe = fused.ProbeInExport(ctx)
        self.export_tasks = probe.bridge_tasks
        stream = ctx.bridge.export_hf_weights(ctx.model, cpu=cpu, show_progress=False, conversion_tasks=probe.tasks)
        return hold(ctx, probe.drain(stream))


def _call(consumer: Consumer, step: str, *args: Any) -> None:
    """`consumer.step(*args)`; what it raises is raised on, noted with the consumer's class and the step."""
    try:
        getattr(consumer, step)(*args)
    except Exception as exc:
        exc.add_note(f"raised by export consumer {type(consumer).__name__}.{step}")
        raise
