"""The probe keeps mapping classes' class-level state apart (convcheck.probe.class_state), on the bridge's own
ERNIE 4.5 VL bias mapping, whose text task leaves its output in a class-level buffer for the vision task."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from convcheck import compat

compat.install_import_shims()  # the probe imports the bridge's mapping classes

from megatron.bridge.models.conversion.param_mapping import AutoMapping  # noqa: E402
from megatron.bridge.models.ernie_vl.ernie45_vl_bridge import _ConcatBiasMapping  # noqa: E402

from convcheck.oracles import differential, elements  # noqa: E402
from convcheck.probe.class_state import CarriesState  # noqa: E402
from convcheck.probe.collect import uncovered  # noqa: E402
from convcheck.probe.run import CodeCache, probe_task  # noqa: E402

HF = "model.layers.1.mlp.moe_statics.e_score_correction_bias"
ROUTER = "language_model.decoder.layers.1.mlp.{}_moe_layer.router.expert_bias"


def _task(mapping: object) -> SimpleNamespace:
    """A replicated [4] expert bias on a real RMSNorm module (AutoMapping's registry reads it as replicated)."""
    return SimpleNamespace(mapping=mapping, megatron_module=torch.nn.RMSNorm(4), param_weight=torch.zeros(4))


def test_the_probe_of_a_task_that_carries_values_is_no_evidence_and_leaves_the_real_buffer_alone() -> None:
    """The real export's text task has buffered its bias; the probe's text and vision runs each raise CarriesState
    (naming the buffer), and the real vision task still finds the real text bias, the very tensor, afterwards."""
    text = _ConcatBiasMapping(ROUTER.format("text"), HF, "text", 4)
    vision = _ConcatBiasMapping(ROUTER.format("vision"), HF, "vision", 4)
    real_text = torch.arange(4.0)
    _ConcatBiasMapping._export_buffer.clear()
    _ConcatBiasMapping._export_buffer[HF] = real_text
    try:
        cache = CodeCache()
        for mapping in (text, vision):
            with pytest.raises(CarriesState, match=r"_ConcatBiasMapping\._export_buffer \(class-level state\)"):
                probe_task(_task(mapping), 0, cache)
        assert list(_ConcatBiasMapping._export_buffer) == [HF] and _ConcatBiasMapping._export_buffer[HF] is real_text
    finally:
        _ConcatBiasMapping._export_buffer.clear()


def test_a_mapping_that_only_reads_class_state_is_probed() -> None:
    """AutoMapping reads its class-level module-type registry on every task: no write, so the probe's slots stand
    (every element of the replicated weight lands at its own index)."""
    slots = probe_task(_task(AutoMapping(ROUTER.format("text"), HF)), 0, CodeCache())
    assert list(slots) == [HF] and slots[HF].runs.tolist() == [[0, 0, 4]]


def _records() -> list[list[dict]]:
    """Two ranks' records: the bias tasks not covered, one other tensor probed and written once whole."""
    nc = "X._buf (class-level state) carries values between this task and another"
    other = {
        "task": 2,
        "param": "w",
        "hf": "model.w",
        "shape": [4],
        "writer": [],
        "ranges": [(0, 4)],
        "owned": 4,
        "real": {"shape": [4], "dtype": "bfloat16", "digest": "d"},
    }
    return [
        [
            {"task": 0, "param": ROUTER.format("text"), "not_covered": nc, "hf_names": [HF]},
            {"task": 1, "param": ROUTER.format("vision"), "not_covered": nc, "hf_names": [HF]},
            other,
        ]
        for _ in range(2)
    ]


def test_the_oracles_leave_out_what_the_probe_cannot_follow_and_say_so() -> None:
    """Neither the differential nor the elements oracle reports a finding for the not-covered tasks or their HF
    tensor (not `never-written`, not `nothing-checked`); the reason names the count, the first task and its tensor."""
    gathered = _records()
    left = uncovered(gathered)
    assert left.params == {ROUTER.format("text"), ROUTER.format("vision")} and left.hf == {HF}
    assert left.reason == (
        f"2 task(s) the probe cannot follow, their 1 HF tensor(s) left to roundtrip and layout; first "
        f"{ROUTER.format('text')} ({HF}): X._buf (class-level state) carries values between this task and another"
    )
    assert elements.assemble(gathered, {HF: (2, 4), "model.w": (4,)}) == ([], 4)
    findings, counts = differential.assemble(gathered)
    assert findings == [] and counts == {"w": 4}
    verdict = differential._verdict(findings, {"w": 4}, not_covered=left.reason)
    assert (verdict.verdict, verdict.not_covered) == ("not-covered", left.reason)


def test_the_oracles_still_fail_a_never_written_tensor_beside_a_not_covered_one() -> None:
    """Leaving the not-covered tensor out does not hide another: a source tensor no probe writes is still a finding."""
    findings, _ = elements.assemble(_records(), {HF: (2, 4), "model.w": (4,), "model.lost": (3,)})
    assert [(f.tensor, f.kind) for f in findings] == [("model.lost", "never-written")]
