"""The probe on ERNIE 4.5 VL's own conversion at EP2: the vision experts' EP gather is the bridge class's override
(an expert offset past the text pool), and the probe follows it instead of the generic contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import mutant, run_cli

ARCH = "Ernie4_5_VLMoeForConditionalGeneration"


@pytest.mark.ranks
def test_vision_experts_gathered_without_their_offset_are_named_by_the_elements_oracle(tmp_path: Path) -> None:
    """The bridge's `_offset_gather_from_ep_ranks`, planted to drop the offset in layer 1: vision expert j lands on HF
    expert j. The elements oracle names every vision expert of the layer never written and the text experts' tensors
    written with the vision experts' narrower shape (first unwritten row 48), through the real override run by the
    probe (the generic EP contract made a probe-failed finding of every vision expert instead). The expert-bias
    tasks that carry values through the class-level buffer are left not covered, never a finding."""
    from convcheck.fixtures.support_child import write_checkpoint

    model = tmp_path / ARCH
    write_checkpoint(ARCH, model)
    r = run_cli("verify", "--model", str(model), "--ep", "2", "--oracle", "differential,elements",
                "--hook", mutant("ernie_vl", "vision_experts_lose_their_offset"), tmp_path=tmp_path)  # fmt: skip
    assert r.code == 1, r.stderr
    assert r.verdicts() == {"differential": "not-covered", "elements": "fail"}
    layer = "model.layers.1.mlp.experts"
    never = {
        (f"{layer}.{e}.{p}_proj.weight", "never-written", (0, 0)) for e in range(4, 8) for p in ("gate", "up", "down")
    }
    shape = {(f"{layer}.{e}.{p}_proj.weight", "shape", (48, 0) if p != "down" else (0, 48))
             for e in range(4) for p in ("gate", "up", "down")}  # fmt: skip
    got = {(f["tensor"], f["kind"], tuple(f["detail"]["first_index"])) for f in r.findings("elements")}
    assert got == never | shape
    differential = next(o for o in r.report["oracles"] if o["name"] == "differential")
    assert differential["not_covered"].startswith("2 task(s) the probe cannot follow, their 1 HF tensor(s) left to ")
    assert "_ConcatBiasMapping._export_buffer (class-level state)" in differential["not_covered"]
