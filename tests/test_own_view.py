"""convcheck.probe.collect's own-view records: at TP1 with no gather due, a real Megatron-Bridge conversion whose
outputs are views inside its own unwritten weight gets the records the slots read off those views would give,
without building the slots; anything else still goes through the slots (or the probe)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from convcheck.layout import ParallelLayout
from convcheck.probe import collect
from convcheck.probe.run import CodeCache
from convcheck.probe.runs import shard_codes, view_runs, within

CTX = SimpleNamespace(layout=ParallelLayout(), world=1, rank=0)


@pytest.fixture(scope="module")
def upstream() -> Any:
    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge.models.conversion import model_bridge, param_mapping

    return model_bridge, param_mapping


def _task(upstream: Any, mapping: Any, weight: torch.Tensor) -> Any:
    model_bridge, _ = upstream
    name = mapping.megatron_param
    return model_bridge.WeightConversionTask(
        param_name=name, global_param_name=name, mapping=mapping, pp_rank=0, megatron_module=None, param_weight=weight
    )


def _cases(upstream: Any) -> list[tuple[Any, torch.Tensor]]:
    _, pm = upstream
    weight = torch.randn(8, 6).to(torch.bfloat16)
    return [
        (pm.GatedMLPMapping(megatron_param="decoder.layers.0.mlp.linear_fc1.weight", gate="g", up="u"), weight),
        (pm.ReplicatedMapping(megatron_param="decoder.layers.0.input_layernorm.weight", hf_param="n"), weight[0]),
    ]


def _records(task: Any, real: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    return collect.task_records(CTX, 3, task, real, CodeCache(), with_real=True, unwritten=True)


def test_own_view_records_are_the_slot_records(upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for mapping, weight in _cases(upstream):
        task = _task(upstream, mapping, weight)
        real = dict(mapping.megatron_to_hf(weight, None))
        assert all(t.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr() for t in real.values())
        lean = _records(task, real)
        with monkeypatch.context() as m:
            m.setattr(collect, "_own_view_records", lambda *_: None)  # the slots read off the same views
            slotted = _records(task, real)
        assert lean == slotted and len(lean) == len(real)
        assert all(r["ranges"] == [(0, r["owned"])] and r["writer"] == [] for r in lean)


def test_an_output_that_is_not_the_weights_own_view_takes_the_probe(upstream: Any) -> None:
    """A copy (what a gather returns) is not read off: the probe says where its elements come from, and the real
    bytes are compared with them (a planted wrong element is named)."""
    mapping, weight = _cases(upstream)[0]
    real = {k: v.clone() for k, v in mapping.megatron_to_hf(weight, None).items()}
    real["u"].view(torch.int16)[1, 2] ^= 1
    records = {r["hf"]: r for r in _records(_task(upstream, mapping, weight), real)}
    assert "mismatch" not in records["g"]
    assert records["u"]["mismatch"]["first"] == [1, 2] and records["u"]["mismatch"]["count"] == 1


def test_within_is_exactly_where_view_runs_reads_strides() -> None:
    codes, _ = shard_codes((4, 6), 0, 24)
    views = [codes, codes[1:], codes[:, 2:], codes.t(), codes[::2], codes[:1].expand(3, -1), codes.reshape(-1)[5:9]]
    for view in views:
        assert within(view, codes) == (view_runs(view, codes) is not None), (view.shape, view.stride())
    buf = torch.arange(30, dtype=torch.int32)
    base = buf[:24]
    assert within(buf[4:24].view(4, 5), base) and not within(buf[5:25].view(4, 5), base)  # one past the end
    assert not within(buf[25:], base) and not within(base[:0], base) and not within(base.clone(), base)
    assert not within(base.view(torch.float32), base)
    assert not within(buf[:4], buf[4:]) and not within(buf[2:6], buf[4:])  # memory before the base's first element
    assert not within(codes.t()[:1], codes.t())  # a base that is not contiguous


@pytest.mark.parametrize("where", ["_own_view_records", "_slot_facts", "_against_real"])
def test_convcheck_raising_while_recording_is_the_tasks_error_record(
    upstream: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """An error of convcheck's own while it records a real output (planted in each place the records are made: the
    own-view path, the slots' facts, the compare) is the task's error record on this rank, a probe-failed finding for
    the assembler, and never a raise out of the bridge's export: its peers would wait in the next collective."""
    from convcheck.oracles.differential import assemble

    mapping, weight = _cases(upstream)[0]
    real = dict(mapping.megatron_to_hf(weight, None))
    if where != "_own_view_records":
        real = {k: v.clone() for k, v in real.items()}  # copies: the slots and the compare run

    def planted(*_: Any, **__: Any) -> Any:
        raise RuntimeError("planted in convcheck")

    monkeypatch.setattr(collect, where, planted)
    records = _records(_task(upstream, mapping, weight), real)
    message = (
        "probe failed: RuntimeError: planted in convcheck"  # the own-view records stand where the probe would run
        if where == "_own_view_records"
        else "convcheck raised RuntimeError: planted in convcheck recording the real output"
    )
    param = mapping.megatron_param
    assert records == [{"task": 3, "param": param, "error": message}]
    findings, counts = assemble([records])
    assert [(f.tensor, f.kind, f.message) for f in findings] == [(param, "probe-failed", f"rank 0: {message}")]
    assert counts == {param: 0}
