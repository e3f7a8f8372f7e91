"""Fused HF experts (tiny:qwen3.6-moe, Qwen3.6's `experts.gate_up_proj` [E, 2F, H] / `experts.down_proj` [E, H, F]):
the probe follows FusedGatedExpertMapping / FusedExpertMapping through the bridge's grouped export, the explicit
mappings map each expert to its slice; planted bugs in the real bridge objects are named by tensor and first wrong
element."""

from pathlib import Path

import pytest

from convcheck.layout import ParallelLayout, RankCoord
from convcheck.mappings import Gated, Split
from convcheck.mappings.fused_experts import FusedSlice
from tests.support.helpers import mutant, run_cli

ORACLES = ("--oracle", "coverage,roundtrip,differential,elements,mapping")
MODEL = ("--model", "tiny:qwen3.6-moe", "--experts", "te-grouped", "--ep", "2")
GATE_UP = "model.layers.0.mlp.experts.gate_up_proj"


def _findings(res, oracle: str) -> dict[str, tuple[str, list[int]]]:  # type: ignore[no-untyped-def]
    return {f["tensor"]: (f["kind"], f["detail"].get("first_index")) for f in res.findings(oracle)}


def test_fused_slice_is_gate_rows_then_up_rows_of_expert_e() -> None:
    import torch

    fused = torch.arange(4 * 8 * 3, dtype=torch.float32).reshape(4, 8, 3)  # E=4, 2F=8, hidden=3
    layout = ParallelLayout(ep=2, etp=2)
    inner = Gated(megatron="fc1.weight3", axis="etp", expert=3, num_experts=4, gate="g", up="u")
    fc1 = FusedSlice(inner=inner, fused="gate_up_proj")
    shard = fc1.to_shard({"gate_up_proj": fused}, layout, RankCoord(ep_rank=1, etp_rank=1))
    assert torch.equal(shard, torch.cat([fused[3, 2:4], fused[3, 6:8]]))
    down = torch.arange(4 * 3 * 4, dtype=torch.float32).reshape(4, 3, 4)  # [E, hidden, F]
    inner2 = Split(megatron="fc2.weight1", axis="etp", dim=1, expert=1, num_experts=4, hf="d")
    fc2 = FusedSlice(inner=inner2, fused="down_proj")
    assert torch.equal(fc2.to_shard({"down_proj": down}, layout, RankCoord(ep_rank=0, etp_rank=0)), down[1, :, :2])
    shards = {c: fc1.to_shard({"gate_up_proj": fused}, layout, c) for c in fc1.coords(layout)}
    assert [(n, t.tolist()) for n, t in fc1.from_shards(shards, layout)] == [("gate_up_proj[3]", fused[3].tolist())]


@pytest.mark.ranks
def test_fused_experts_pass_differential_elements_and_mapping(tmp_path: Path) -> None:
    res = run_cli("verify", *ORACLES, *MODEL, tmp_path=tmp_path)
    assert res.code == 0, res.err
    assert set(res.verdicts().values()) == {"pass"}
    assert res.findings() == []


@pytest.mark.ranks
def test_ep_gather_reversed_is_named_by_differential_and_mapping(tmp_path: Path) -> None:
    hook = mutant("fused_experts", "ep_gather_reversed")
    res = run_cli("verify", *ORACLES, *MODEL, "--hook", hook, tmp_path=tmp_path)
    assert res.code == 1, res.err
    assert res.verdicts() == {
        "coverage": "pass",
        "roundtrip": "fail",
        "differential": "fail",
        "elements": "pass",
        "mapping": "fail",
    }
    assert _findings(res, "roundtrip") == {GATE_UP: ("bytes-differ", [0, 0, 0])}
    assert _findings(res, "differential") == {GATE_UP: ("differs", [0, 0, 0])}
    assert _findings(res, "mapping") == {GATE_UP: ("export-bytes-differ", [0, 0, 0])}


@pytest.mark.ranks
def test_gate_up_halves_swapped_is_named_by_mapping(tmp_path: Path) -> None:
    """The probe runs the real (buggy) FusedGatedExpertMapping, so the differential agrees with it; the explicit
    mapping (gate rows first) names it."""
    hook = mutant("fused_experts", "gate_up_halves_swapped")
    res = run_cli("verify", *ORACLES, *MODEL, "--hook", hook, tmp_path=tmp_path)
    assert res.code == 1, res.err
    assert res.verdicts() == {
        "coverage": "pass",
        "roundtrip": "fail",
        "differential": "pass",
        "elements": "pass",
        "mapping": "fail",
    }
    assert _findings(res, "roundtrip") == {GATE_UP: ("bytes-differ", [0, 0, 0])}
    assert _findings(res, "mapping") == {GATE_UP: ("export-bytes-differ", [0, 0, 0])}
