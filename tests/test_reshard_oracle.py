"""Reshard oracle through real launches (real bridge, gloo): trainer TP1/TP2 -> target TP 1/2/4 on tiny:qwen3 (2 kv
heads: replicated at TP4), TP2xEP2 -> TP 1/2/4 x EP2 on tiny:qwen3-moe; each planted bug named with its first wrong
element. One launch checks several target TPs; several planted bugs on distinct tensors share a launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import CliResult, mutant, run_cli

TARGETS = ("--target-tp", "1", "--target-tp", "2", "--target-tp", "4")
DENSE_PARAMS = 19
"""tiny:qwen3: embedding, output, final norm + 8 per layer x 2 layers."""
QKV0 = "decoder.layers.0.self_attention.linear_qkv.weight"
QKV1 = "decoder.layers.1.self_attention.linear_qkv.weight"
PROJ0 = "decoder.layers.0.self_attention.linear_proj.weight"
PROJ1 = "decoder.layers.1.self_attention.linear_proj.weight"


def _verify(tmp: Path, *args: str) -> CliResult:
    return run_cli("verify", *args, "--oracle", "reshard", "--device", "cpu", tmp_path=tmp)


def _oracle(result: CliResult) -> dict[str, Any]:
    assert result.report is not None, result.err
    (oracle,) = result.report["oracles"]
    return oracle


def _where(finding: dict[str, Any]) -> tuple[Any, ...]:
    d = finding.get("detail", {})
    return (finding["tensor"], finding["kind"], d.get("target"), d.get("target_rank"), tuple(d.get("first_index", ())))


@pytest.fixture(scope="module")
def dense_tp1(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    return _verify(tmp_path_factory.mktemp("tp1"), "--model", "tiny:qwen3", *TARGETS)


@pytest.fixture(scope="module")
def dense_tp2(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    return _verify(tmp_path_factory.mktemp("tp2"), "--model", "tiny:qwen3", "--tp", "2", *TARGETS)


@pytest.fixture(scope="module")
def moe_ep2(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    args = ("--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "2", *TARGETS, "--target-ep", "2")
    return _verify(tmp_path_factory.mktemp("moe"), *args)


def _assert_clean(result: CliResult, checked: int, labels: tuple[str, ...]) -> dict[str, Any]:
    oracle = _oracle(result)
    assert (result.code, oracle["verdict"], oracle["findings"], oracle["checked"]) == (0, "pass", [], checked)
    assert tuple(oracle["metrics"]) == labels
    for m in oracle["metrics"].values():
        assert m["moved_bytes"] == m["shard_bytes"], "every target element moved exactly once (no padding here)"
        assert all(b < m["allgather_bytes"] for b in m["moved_bytes"]) or len(m["moved_bytes"]) == 1
    return oracle["metrics"]


@pytest.mark.ranks
def test_trainer_tp1_to_target_tp_1_2_4(dense_tp1: CliResult) -> None:
    metrics = _assert_clean(dense_tp1, DENSE_PARAMS * 7, ("tp1", "tp2", "tp4"))
    assert metrics["tp1"]["moved_bytes"] == [metrics["tp1"]["allgather_bytes"]]  # TP1 target: the whole model


@pytest.mark.ranks
def test_trainer_tp2_to_target_tp_1_2_4_moves_only_slices(dense_tp2: CliResult) -> None:
    metrics = _assert_clean(dense_tp2, DENSE_PARAMS * 7, ("tp1", "tp2", "tp4"))
    assert metrics["tp2"]["remote_bytes"] == [0, 0], "same TP: every slice is already on its host"
    assert all(b > 0 for b in metrics["tp4"]["remote_bytes"][1:3]), "TP4 ranks 1, 2 pull from the other trainer rank"
    assert metrics["tp1"]["remote_bytes"][0] > 0


@pytest.mark.ranks
def test_trainer_tp2ep2_to_target_tp_1_2_4_ep2(moe_ep2: CliResult) -> None:
    # 17 dense + 32 expert params; experts on the ranks of their target EP rank (lcm(tp, 2) ranks)
    _assert_clean(moe_ep2, (17 * 2 + 32) + (17 * 2 + 32) + (17 * 4 + 32 * 2), ("tp1ep2", "tp2ep2", "tp4ep2"))


@pytest.fixture(scope="module")
def planted_dense(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    hooks = ("replicated_linear_proj", "qkv_no_deinterleave", "kv_not_replicated")
    args = [a for h in hooks for a in ("--hook", mutant("reshard", h))]
    return _verify(
        tmp_path_factory.mktemp("planted"), "--model", "tiny:qwen3", "--target-tp", "2", "--target-tp", "4", *args
    )


@pytest.mark.ranks
def test_planted_role_replicated_is_named(planted_dense: CliResult) -> None:
    """The bridge resolving a row-parallel weight to ReplicatedMapping: role-mismatch, and every target shard of it
    has the whole tensor's shape."""
    mine = [_where(f) for f in _oracle(planted_dense)["findings"] if f["tensor"] == PROJ0]
    assert mine == [(PROJ0, "role-mismatch", None, None, ())] + [
        (PROJ0, "shape", label, rank, ()) for label, n in (("tp2", 2), ("tp4", 4)) for rank in range(n)
    ]
    first = next(f for f in _oracle(planted_dense)["findings"] if f["kind"] == "shape")
    assert first["message"] == "target tp2 rank 0: shape [32, 32], expected [32, 16]"


@pytest.mark.ranks
def test_planted_qkv_without_deinterleave_is_named(planted_dense: CliResult) -> None:
    """Layer 0's qkv read as [q; k; v]: wrong from the first k row of each target rank that holds group 0's q."""
    mine = [_where(f) for f in _oracle(planted_dense)["findings"] if f["tensor"] == QKV0]
    assert mine == [
        (QKV0, "bytes-differ", "tp2", 0, (16, 0)),
        (QKV0, "bytes-differ", "tp2", 1, (0, 0)),
        (QKV0, "bytes-differ", "tp4", 0, (8, 0)),
        (QKV0, "bytes-differ", "tp4", 1, (8, 0)),
        (QKV0, "bytes-differ", "tp4", 2, (0, 0)),
        (QKV0, "bytes-differ", "tp4", 3, (0, 0)),
    ]
    first = next(f for f in _oracle(planted_dense)["findings"] if f["tensor"] == QKV0)
    assert first["message"].startswith("target tp2 rank 0: 511/1024 elements differ; first at index [16, 0]: got ")


@pytest.mark.ranks
def test_planted_kv_not_replicated_is_named(planted_dense: CliResult) -> None:
    """Layer 1's 2 kv heads dealt round-robin at TP4: ranks 1 and 2 get the other group's k (row 8 = first k row)."""
    mine = [_where(f) for f in _oracle(planted_dense)["findings"] if f["tensor"] == QKV1]
    assert mine == [(QKV1, "bytes-differ", "tp4", 1, (8, 0)), (QKV1, "bytes-differ", "tp4", 2, (8, 0))]


@pytest.mark.ranks
def test_planted_dense_verdict_is_exactly_the_planted_bugs(planted_dense: CliResult) -> None:
    oracle = _oracle(planted_dense)
    assert (planted_dense.code, oracle["verdict"], oracle["checked"]) == (1, "fail", DENSE_PARAMS * 6)
    assert {f["tensor"] for f in oracle["findings"]} == {PROJ0, QKV0, QKV1}
    assert "--target-tp 2 --target-tp 4" in planted_dense.out  # the replay line keeps the targets


@pytest.fixture(scope="module")
def planted_moe(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    hooks = ("wrong_row_source", "local_expert_id")
    args = [a for h in hooks for a in ("--hook", mutant("reshard", h))]
    model = ("--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "2", "--target-tp", "2")
    return _verify(tmp_path_factory.mktemp("planted-moe"), *model, *args)


@pytest.mark.ranks
def test_planted_wrong_row_source_rank_is_named(planted_moe: CliResult) -> None:
    """Layer 1's linear_proj slices read from the other TP rank: both target ranks wrong from element [0, 0]."""
    mine = [_where(f) for f in _oracle(planted_moe)["findings"] if f["tensor"] == PROJ1]
    assert mine == [(PROJ1, "bytes-differ", "tp2", 0, (0, 0)), (PROJ1, "bytes-differ", "tp2", 1, (0, 0))]
    first = next(f for f in _oracle(planted_moe)["findings"] if f["tensor"] == PROJ1)
    assert first["message"].startswith("target tp2 rank 0: 512/512 elements differ; first at index [0, 0]: got ")


@pytest.mark.ranks
def test_planted_local_expert_id_is_named(planted_moe: CliResult) -> None:
    """Trainer EP rank 1 registers experts 4-7 as local_experts.0-3: a role conflict naming both HF experts, and
    target rank 1 (hosted on trainer rank 1) assembles expert 4's weights as expert 0's."""
    oracle = _oracle(planted_moe)
    assert (planted_moe.code, oracle["verdict"], oracle["checked"]) == (1, "fail", 2 * (17 + 16))
    experts = [
        f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc{fc}.weight"
        for layer in (0, 1)
        for e in range(4)
        for fc in (1, 2)
    ]
    mine = sorted(_where(f) for f in oracle["findings"] if f["tensor"] != PROJ1)
    assert mine == sorted(
        [(n, "bytes-differ", "tp2", 1, (0, 0)) for n in experts]
        + [(n, "role-conflict", None, None, ()) for n in experts]
    )
    conflict = next(f for f in oracle["findings"] if f["kind"] == "role-conflict")
    assert conflict["tensor"] == experts[0] and "experts.4.gate_proj" in conflict["message"]
    assert "experts.0.gate_proj" in conflict["message"]


@pytest.mark.ranks
def test_trainer_tp2_qwen2_with_qkv_bias(tmp_path: Path) -> None:
    """tiny:qwen2's fused qkv bias (1-D) follows the weight's head rows, kv replicated at TP4."""
    result = _verify(tmp_path, "--model", "tiny:qwen2", "--tp", "2", *TARGETS)
    oracle = _oracle(result)
    assert (result.code, oracle["verdict"], oracle["findings"]) == (0, "pass", [])
    assert any(r["tensor"].endswith("linear_qkv.bias") and r["verdict"] == "pass" for r in oracle["tensors"])
