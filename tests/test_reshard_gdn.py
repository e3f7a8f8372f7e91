"""Reshard oracle on the GDN hybrids through real launches (real bridge, gloo): tiny:qwen3-next and tiny:qwen3.5 at
trainer TP2 -> target TP 1/2/4 (sectioned GDN in_proj / conv1d, gated fused qkv, zero-centered out_norm), and planted
bugs in the GDN roles, each named with its tensor, target rank and first wrong element."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import CliResult, mutant, run_cli

TARGETS = ("--target-tp", "1", "--target-tp", "2", "--target-tp", "4")
RANKS = 1 + 2 + 4
"""Target ranks over the three target layouts."""
IN_PROJ = "decoder.layers.1.self_attention.in_proj.weight"
OUT_NORM = "decoder.layers.2.self_attention.out_norm.weight"
GATED_QKV = "decoder.layers.3.self_attention.linear_qkv.weight"


def _verify(tmp: Path, *args: str) -> CliResult:
    return run_cli("verify", *args, "--tp", "2", *TARGETS, "--oracle", "reshard", "--device", "cpu", tmp_path=tmp)


def _oracle(result: CliResult) -> dict[str, Any]:
    assert result.report is not None, result.err
    (oracle,) = result.report["oracles"]
    return oracle


@pytest.mark.ranks
@pytest.mark.parametrize(("model", "params"), [("tiny:qwen3-next", 141), ("tiny:qwen3.5", 51)])
def test_gdn_family_reshards_clean(tmp_path: Path, model: str, params: int) -> None:
    """Every target shard bitwise the HF-computed one; each target rank moves exactly its shard's bytes."""
    result = _verify(tmp_path, "--model", model)
    oracle = _oracle(result)
    assert (result.code, oracle["verdict"], oracle["findings"], oracle["checked"]) == (0, "pass", [], params * RANKS)
    assert tuple(oracle["metrics"]) == ("tp1", "tp2", "tp4")
    for m in oracle["metrics"].values():
        assert m["moved_bytes"] == m["shard_bytes"]
    assert oracle["metrics"]["tp2"]["remote_bytes"] == [0, 0], "the trainer's own TP: nothing crosses ranks"
    names = {r["tensor"] for r in oracle["tensors"] if r["verdict"] == "pass"}
    assert {"decoder.layers.1.self_attention.conv1d.weight", IN_PROJ, OUT_NORM, GATED_QKV} <= names


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    hooks = ("gdn_sections_misordered", "gated_qkv_q_gate_swapped", "norm_offset_dropped")
    args = [a for h in hooks for a in ("--hook", mutant("reshard", h))]
    return _verify(tmp_path_factory.mktemp("planted-gdn"), "--model", "tiny:qwen3-next", *args)


def _where(finding: dict[str, Any]) -> tuple[Any, ...]:
    d = finding["detail"]
    return (finding["tensor"], finding["kind"], d["target"], d["target_rank"], tuple(d["first_index"]), d["count"])


@pytest.mark.ranks
def test_planted_gdn_bugs_are_named(planted: CliResult) -> None:
    """in_proj sections read as [q, v, k, z, b, a]: wrong from the first row of trainer rank 1's k at target TP1
    ([24, 0]: q 16 rows, then k rank 0's 8), from the target's first k rows at TP4, silent at the trainer's own
    TP2 (the sections are contiguous there); q and gate heads traded in the gated qkv: wrong from [0, 0] on every
    target rank, 2 of every 3 rows (k, v intact); out_norm without its + 1: all 8 elements on every target rank."""
    oracle = _oracle(planted)
    assert (planted.code, oracle["verdict"], oracle["checked"]) == (1, "fail", 141 * RANKS)
    tp4 = [(0, (8, 0)), (1, (4, 0)), (2, (8, 0)), (3, (4, 0))]
    want = [(IN_PROJ, "bytes-differ", "tp1", 0, (24, 0), 1024)]
    want += [(IN_PROJ, "bytes-differ", "tp4", r, at, 256) for r, at in tp4]
    layouts = [("tp1", 0, 2048), ("tp2", 0, 1024), ("tp2", 1, 1024)] + [("tp4", r, 512) for r in range(4)]
    want += [(OUT_NORM, "bytes-differ", label, r, (0,), 8) for label, r, _ in layouts]
    want += [(GATED_QKV, "bytes-differ", label, r, (0, 0), n) for label, r, n in layouts]
    assert [_where(f) for f in oracle["findings"]] == want
    norm = next(f for f in oracle["findings"] if f["tensor"] == OUT_NORM)
    assert norm["message"] == (
        "target tp1 rank 0: 8/8 elements differ; first at index [0]: got -0.16015625 (0xbe24), expected "
        "0.83984375 (0x3f57)"
    )
