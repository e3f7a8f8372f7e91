"""convcheck.rank.export_pass: the consumers of one export pass get start / consume / finish in order, a consumer that
raises ends the stream with its own exception, and the riders are the ones the catalog declares (no rank)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch

from convcheck.oracles import riders
from convcheck.rank.export_pass import ExportPass


class Log:
    """A consumer that writes down what it was fed; raises at `fail` ("start", "consume" or "finish")."""

    def __init__(self, label: str, events: list[tuple[Any, ...]], fail: str = "") -> None:
        self.label, self.events, self.fail = label, events, fail

    def _step(self, step: str, *args: Any) -> None:
        self.events.append((self.label, step, *args))
        if step == self.fail:
            raise ValueError(f"{self.label} broke in {step}")

    def start(self) -> None:
        self._step("start")

    def consume(self, name: str, tensor: torch.Tensor) -> None:
        self._step("consume", name, int(tensor.sum()))

    def finish(self, error: str | None) -> None:
        self._step("finish", error)


def _stream(events: list[tuple[Any, ...]]) -> Iterator[tuple[str, torch.Tensor]]:
    for i, name in enumerate(["a", "b"]):
        events.append(("export", name))
        yield name, torch.full((2, 3), i)


def test_consumers_are_fed_start_consume_finish_in_order() -> None:
    events: list[tuple[Any, ...]] = []
    run = ExportPass()
    first, second = run.add(Log("d", events)), run.add(Log("m", events))
    assert run.consumers == [first, second]
    error = "RuntimeError: gather failed at x.py:1"
    items = list(run.feed(_stream(events), lambda: error))
    assert [name for name, _ in items] == ["a", "b"]
    assert events == [
        ("d", "start"), ("m", "start"),
        ("export", "a"), ("d", "consume", "a", 0), ("m", "consume", "a", 0),
        ("export", "b"), ("d", "consume", "b", 6), ("m", "consume", "b", 6),
        ("d", "finish", error), ("m", "finish", error),
    ]  # fmt: skip


def test_a_stream_left_early_finishes_nobody() -> None:
    events: list[tuple[Any, ...]] = []
    run = ExportPass()
    run.add(Log("d", events))
    stream = run.feed(_stream(events), lambda: None)
    next(stream)
    stream.close()
    assert events == [("d", "start"), ("export", "a"), ("d", "consume", "a", 0)]


@pytest.mark.parametrize("step", ["start", "consume", "finish"])
def test_a_consumer_that_raises_is_reported_not_swallowed(step: str) -> None:
    events: list[tuple[Any, ...]] = []
    run = ExportPass()
    run.add(Log("m", events, fail=step))
    with pytest.raises(ValueError, match=f"m broke in {step}") as raised:
        list(run.feed(_stream(events), lambda: None))
    assert raised.value.__notes__ == [f"raised by export consumer Log.{step}"]
    assert events[-1][:2] == ("m", step)  # nothing was fed after it


def test_what_the_pass_leaves_starts_empty() -> None:
    run = ExportPass()
    assert (run.probe, run.source_match, run.shard_match, run.export_tasks, run.proven_bytes) == (None,) * 5
    assert run.probes_shared == 0 and run.held == [] and not run.probe_pending


def test_riders_follow_the_catalog_declarations_verify_and_live() -> None:
    assert riders(["coverage", "roundtrip", "differential", "elements", "layout", "mapping"]) == frozenset(
        {"differential", "mapping"}
    )
    assert riders(["coverage", "differential", "mapping"]) == frozenset({"differential"})  # no source reads before
    assert riders(["coverage", "differential", "mapping"], live=True) == frozenset({"differential", "mapping"})
    assert riders(["mapping", "coverage"], live=True) == frozenset()
