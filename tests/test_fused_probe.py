"""convcheck.probe.fused: the differential's records from an export drain equal its own; partial drains keep none."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch

from convcheck.oracles import riders
from convcheck.probe import fused
from convcheck.probe.collect import collect, origin
from convcheck.probe.run import CodeCache
from convcheck.probe.runs import hf_ranges
from convcheck.rank.export_pass import ExportPass


class Halves:
    """Export-side mapping of a plain local kind: the shard is HF tensor `name`, rows in reverse order."""

    def __init__(self, name: str) -> None:
        self.name = name

    def megatron_to_hf(self, weights: torch.Tensor, module: object) -> dict[str, torch.Tensor]:
        return {self.name: weights.flip(0)}


@dataclass(frozen=True)
class Task:
    param_name: str
    global_param_name: str
    mapping: Any
    param_weight: Any
    megatron_module: Any = None


@pytest.fixture(autouse=True)
def _shims() -> None:
    from convcheck import compat

    compat.install_import_shims()  # the probe imports megatron.bridge (no Transformer Engine here)


def _layout(tp: int = 1, ep: int = 1) -> Any:
    return SimpleNamespace(tp=tp, pp=1, ep=ep, etp=1)


def _ctx() -> Any:
    weights = [torch.arange(12, dtype=torch.bfloat16).reshape(4, 3) + i for i in range(3)]
    tasks = [Task(f"p{i}", f"p{i}", Halves(f"hf{i}"), w) for i, w in enumerate(weights)]
    bridge = SimpleNamespace(get_conversion_tasks=lambda model: list(tasks))
    return SimpleNamespace(
        bridge=bridge, model=[], rank=0, world=1, layout=_layout(), phase="oracle x", exports=ExportPass()
    )


def _export(tasks: list[Task], *, swap_args: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """What the bridge's stream does with pre-built tasks: call each mapping, yield its outputs."""
    for task in tasks:
        weight = task.param_weight.clone() if swap_args else task.param_weight
        yield from task.mapping.megatron_to_hf(weight, task.megatron_module).items()


def _strip(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "real"} | {"real": r.get("real")} for r in records]


def test_a_full_drain_leaves_the_records_collect_would_make() -> None:
    ctx, alone = _ctx(), _ctx()
    tap = fused.ProbeInExport(ctx)
    names = [name for name, _ in tap.drain(_export(tap.tasks))]
    assert names == ["hf0", "hf1", "hf2"]
    assert origin(ctx) is not None and origin(ctx)["in"] == "x"
    assert _strip(collect(ctx, with_real=True)) == _strip(collect(alone, with_real=True))
    assert origin(alone) is None and all(r["ranges"] == [(0, 12)] for r in collect(ctx, with_real=True))


@pytest.mark.parametrize("how", ["stopped-early", "other-arguments", "raised"])
def test_a_drain_that_is_not_the_whole_export_keeps_nothing(how: str) -> None:
    ctx = _ctx()
    tap = fused.ProbeInExport(ctx)
    if how == "stopped-early":
        stream = tap.drain(_export(tap.tasks))
        next(stream)
        stream.close()
    elif how == "other-arguments":
        list(tap.drain(_export(tap.tasks, swap_args=True)))
    else:
        original = ctx.bridge.get_conversion_tasks(ctx.model)[1].mapping

        def boom(weights: Any, module: Any) -> Any:
            raise RuntimeError("gather failed")

        original.megatron_to_hf = boom  # the shell forwards to the real mapping, which now raises
        with pytest.raises(RuntimeError, match="gather failed"):
            list(tap.drain(_export(tap.tasks)))
    assert origin(ctx) is None and ctx.exports.probe is None


class Views:
    """A mapping whose outputs are views of the shard: the whole of it, one row block, and its transpose."""

    def megatron_to_hf(self, weights: torch.Tensor, module: object) -> dict[str, torch.Tensor]:
        return {"all": weights, "rows": weights[1:3], "cols": weights.t()}


def test_views_of_the_own_weight_give_the_probes_slots_without_running_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs that are views of the unwritten weight are read off their strides; the probe runs only for what is
    not such a view (the transpose here), and every slot equals the one the probe gives."""
    from convcheck.probe import collect as collect_mod
    from convcheck.probe.run import CodeCache, probe_task

    ctx = _ctx()
    weight = torch.arange(12, dtype=torch.bfloat16).reshape(4, 3)
    task = Task("p", "p", Views(), weight)
    real = Views().megatron_to_hf(weight, None)
    probed = probe_task(task, 0, CodeCache())
    runs = []
    monkeypatch.setattr(collect_mod, "probe_task", lambda *a: runs.append(1) or probe_task(*a))
    got = collect_mod.task_records(ctx, 0, task, real, CodeCache(), with_real=True, unwritten=True)
    assert runs == [1]  # "cols" (a transpose: last dim not contiguous) needed the probe
    assert {r["hf"]: r["ranges"] for r in got} == {n: hf_ranges(s.runs) for n, s in probed.items()}
    del real["cols"]
    runs.clear()
    got = collect_mod.task_records(ctx, 0, task, real, CodeCache(), with_real=True, unwritten=True)
    assert runs == [] and [r["ranges"] for r in got] == [[(0, 12)], [(0, 6)]]
    assert all("mismatch" not in r and r["writer"] == [] for r in got)
    got = collect_mod.task_records(ctx, 0, task, real, CodeCache(), with_real=True, unwritten=False)
    assert runs == [1]  # a conversion that wrote into the weight is probed


def test_a_conversion_that_writes_into_the_weight_is_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path needs an unwritten weight: collect and the export drain see the weight's version counter move
    when a mapping writes into it while exporting a view of it, and run the probe."""
    from convcheck.probe import collect as collect_mod

    class Scribbles:
        def megatron_to_hf(self, weights: torch.Tensor, module: object) -> dict[str, torch.Tensor]:
            weights.view(-1)[0] = weights.view(-1)[5]
            return {"w": weights}

    runs = []
    real_probe = collect_mod.probe_task
    monkeypatch.setattr(collect_mod, "probe_task", lambda *a: runs.append(1) or real_probe(*a))
    for drained in (False, True):
        ctx = _ctx()
        task = Task("p", "p", Scribbles(), torch.arange(12, dtype=torch.bfloat16).reshape(4, 3))
        ctx.bridge = SimpleNamespace(get_conversion_tasks=lambda model, task=task: [task])
        runs.clear()
        if drained:
            tap = fused.ProbeInExport(ctx)
            list(tap.drain(_export(tap.tasks)))
        records = collect_mod.collect(ctx, with_real=True)
        assert records[0]["hf"] == "w" and runs == [1]  # probed once: in the drain, or by collect itself
        assert (origin(ctx) is not None) == drained


@pytest.mark.parametrize(("tp", "ep", "expert", "probed"), [
    (1, 1, True, False), (1, 2, False, False), (1, 2, True, True), (2, 1, False, True),
])  # fmt: skip
def test_views_stand_in_for_the_probe_only_where_no_gather_is_due(
    tp: int, ep: int, expert: bool, probed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An expert's view under EP, or any view under TP, may be a gather the mapping skipped (ep_not_gathered):
    there the probe runs and its slots (the other ranks' global ids) expose it."""
    from convcheck.probe import collect as collect_mod

    runs = []
    real_probe = collect_mod.probe_task
    monkeypatch.setattr(collect_mod, "probe_task", lambda *a: runs.append(1) or real_probe(*a))
    ctx = _ctx()
    ctx.layout = _layout(tp, ep)
    mapping = Views()
    mapping.is_expert = expert
    weight = torch.arange(12, dtype=torch.bfloat16).reshape(4, 3)
    real = {"all": weight}
    collect_mod.task_records(ctx, 0, Task("p", "p", mapping, weight), real, CodeCache(), with_real=True, unwritten=True)
    assert runs == ([1] if probed else [])


def test_the_differential_rides_on_an_earlier_export_drain_only() -> None:
    assert "differential" in riders(["coverage", "roundtrip", "differential"])
    assert "differential" in riders(["layout", "differential"])
    assert "differential" not in riders(["differential", "coverage"])
    assert "differential" not in riders(["config", "logits", "differential", "elements"])
