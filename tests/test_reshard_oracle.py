"""Reshard oracle through real launches (real bridge, gloo): trainer TP1/TP2 -> target TP 1/2/4 on tiny:qwen3 (2 kv
heads: replicated at TP4), TP2xEP2 and TP2xEP2xETP2 -> target TP x EP x ETP on tiny:qwen3-moe; each planted bug named
with its first wrong element. One launch checks every target layout of its TP x EP x ETP product; several planted bugs
on distinct tensors share a launch."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import CliResult, mutant, run_cli

pytestmark = pytest.mark.local_spec("the planned bytes and names of the local layout")

TARGETS = ("--target-tp", "1", "--target-tp", "2", "--target-tp", "4")
DENSE_PARAMS = 19
"""tiny:qwen3: embedding, output, final norm + 8 per layer x 2 layers."""
QKV0 = "decoder.layers.0.self_attention.linear_qkv.weight"
QKV1 = "decoder.layers.1.self_attention.linear_qkv.weight"
PROJ0 = "decoder.layers.0.self_attention.linear_proj.weight"
PROJ1 = "decoder.layers.1.self_attention.linear_proj.weight"


def _verify(tmp: Path, *args: str) -> CliResult:
    spec = () if "--spec" in args else ("--spec", "local")  # module-scoped fixtures run before the marker applies
    return run_cli("verify", *args, *spec, "--oracle", "reshard", "--device", "cpu", tmp_path=tmp)


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


MOE_EXPERT_PARAMS, MOE_DENSE_PARAMS = 32, 17
"""tiny:qwen3-moe: 8 experts x fc1/fc2 x 2 layers; embedding, output, final norm + 7 per layer x 2 layers."""
EXPERT_TARGETS = ("--target-ep", "1", "--target-ep", "2", "--target-etp", "1", "--target-etp", "2")


def _labels(tps: tuple[int, ...], eps: tuple[int, ...], etps: tuple[int, ...]) -> tuple[str, ...]:
    """Target layout labels in the oracle's order (the TP x EP x ETP product)."""
    parts = itertools.product(tps, eps, etps)
    return tuple(f"tp{t}" + (f"ep{e}" if e > 1 else "") + (f"etp{x}" if x > 1 else "") for t, e, x in parts)


def _moe_checked(tps: tuple[int, ...], eps: tuple[int, ...], etps: tuple[int, ...]) -> int:
    """Target shards of tiny:qwen3-moe over the product: dense on all lcm(tp, ep*etp) ranks, experts on 1/ep."""
    worlds = [(math.lcm(t, e * x), e) for t, e, x in itertools.product(tps, eps, etps)]
    return sum(MOE_DENSE_PARAMS * w + MOE_EXPERT_PARAMS * w // e for w, e in worlds)


@pytest.fixture(scope="module")
def moe_ep2(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    args = ("--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "2", *TARGETS, *EXPERT_TARGETS)
    return _verify(tmp_path_factory.mktemp("moe"), *args)


@pytest.fixture(scope="module")
def moe_ep2_etp2(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    args = ("--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "2", "--etp", "2", *TARGETS, *EXPERT_TARGETS)
    return _verify(tmp_path_factory.mktemp("moe-etp"), *args, "--target-etp", "4")


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
def test_trainer_tp2ep2_to_target_tp_x_ep_x_etp(moe_ep2: CliResult) -> None:
    """TP2xEP2 (experts whole) -> 12 target layouts: target TP 1/2/4 x EP 1/2 x ETP 1/2 (experts split)."""
    sizes = ((1, 2, 4), (1, 2), (1, 2))
    metrics = _assert_clean(moe_ep2, _moe_checked(*sizes), _labels(*sizes))
    assert metrics["tp2ep2"]["remote_bytes"] == [0, 0], "the trainer's own layout: nothing crosses ranks"


@pytest.mark.ranks
def test_trainer_expert_tp2_to_target_tp_x_ep_x_etp(moe_ep2_etp2: CliResult) -> None:
    """TP2xEP2xETP2 (each expert's fc1 rows and fc2 columns split over 2 expert-TP ranks) -> 18 target layouts;
    at the trainer's own layout (tp2ep2etp2: expert TP innermost, as in Megatron's grid) nothing crosses ranks."""
    sizes = ((1, 2, 4), (1, 2), (1, 2, 4))
    metrics = _assert_clean(moe_ep2_etp2, _moe_checked(*sizes), _labels(*sizes))
    assert metrics["tp2ep2etp2"]["remote_bytes"] == [0, 0, 0, 0]
    assert all(b > 0 for b in metrics["tp2ep2"]["remote_bytes"]), "whole experts gather both expert-TP halves"


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


EXPERT_ROW = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"
EXPERT_GATED = "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"
SWAPPED = [
    f"decoder.layers.{layer}.mlp.experts.local_experts.7.linear_fc{fc}.weight" for layer in (0, 1) for fc in (1, 2)
]
PLANTED_ETP_SIZES = ((2,), (1, 2), (1, 2, 4))


@pytest.fixture(scope="module")
def planted_etp(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    hooks = ("expert_row_wrong_etp_source", "expert_gate_up_not_deinterleaved", "target_expert_axes_swapped")
    args = [a for h in hooks for a in ("--hook", mutant("reshard", h))]
    model = ("--model", "tiny:qwen3-moe", "--tp", "2", "--etp", "2", "--target-tp", "2")
    targets = ("--target-ep", "1", "--target-ep", "2", "--target-etp", "1", "--target-etp", "2", "--target-etp", "4")
    return _verify(tmp_path_factory.mktemp("planted-etp"), *model, *targets, *args)


def _mine(result: CliResult, tensors: list[str]) -> list[tuple[Any, ...]]:
    return sorted(_where(f) for f in _oracle(result)["findings"] if f["tensor"] in tensors)


@pytest.mark.ranks
def test_planted_expert_row_from_wrong_expert_tp_rank_is_named(planted_etp: CliResult) -> None:
    """Layer 0 expert 1's down projection read from the other trainer expert-TP rank: every target rank holding
    expert 1 (EP rank 0), at every target ETP, wrong from element [0, 0]."""
    held = {"tp2": 2, "tp2ep2": 1, "tp2etp2": 2, "tp2ep2etp2": 2, "tp2etp4": 4, "tp2ep2etp4": 4}
    want = [(EXPERT_ROW, "bytes-differ", label, r, (0, 0)) for label, n in held.items() for r in range(n)]
    assert _mine(planted_etp, [EXPERT_ROW]) == sorted(want)
    first = next(f for f in _oracle(planted_etp)["findings"] if f["tensor"] == EXPERT_ROW)
    assert first["message"].startswith("target tp2 rank 0: 512/512 elements differ; first at index [0, 0]: got ")


@pytest.mark.ranks
def test_planted_expert_gate_up_not_deinterleaved_is_named(planted_etp: CliResult) -> None:
    """Layer 1 expert 2's fc1 planned as plain rows of the trainer's [gate; up] shards: from trainer ETP2 to target
    ETP1 the up rows of shard 0 land where gate rows 8.. belong (index [8, 0]); at target ETP4 rank 0 gets gate rows
    4-7 where up rows 0-3 belong ([4, 0]) and rank 1 up rows where gate rows belong ([0, 0]); at ETP2 (the trainer's
    own split) the packing happens to agree."""
    etp1 = [("tp2", 0), ("tp2", 1), ("tp2ep2", 0)]
    want = [(EXPERT_GATED, "bytes-differ", label, r, (8, 0)) for label, r in etp1]
    want += [(EXPERT_GATED, "bytes-differ", label, r, (4, 0) if r % 2 == 0 else (0, 0))
             for label in ("tp2etp4", "tp2ep2etp4") for r in range(4)]  # fmt: skip
    assert _mine(planted_etp, [EXPERT_GATED]) == sorted(want)


@pytest.mark.ranks
def test_planted_target_expert_axes_swapped_is_named(planted_etp: CliResult) -> None:
    """Expert 7 placed with EP innermost: at EP2xETP2 target rank 1 gets it (rank 2 should), at EP2xETP4 odd ranks
    1, 3 get it (4, 6 should) and ranks 1, 3, 5 a wrong expert-TP slice; EP or ETP 1 alone is unaffected."""
    want = []
    for name in SWAPPED:
        want += [(name, "plan-placement", "tp2ep2etp2", 1, ()), (name, "plan-placement", "tp2ep2etp4", 1, ())]
        want += [(name, "bytes-differ", "tp2ep2etp2", 1, (0, 0))]
        want += [(name, "bytes-differ", "tp2ep2etp4", r, (0, 0)) for r in (1, 3, 5)]
    assert _mine(planted_etp, SWAPPED) == sorted(want)
    placement = next(f for f in _oracle(planted_etp)["findings"] if f["kind"] == "plan-placement")
    assert placement["message"] == (
        "target tp2ep2etp2: planned on target rank(s) [1] that do not hold it, not planned on [2] that do"
    )


@pytest.mark.ranks
def test_planted_etp_verdict_is_exactly_the_planted_bugs(planted_etp: CliResult) -> None:
    oracle = _oracle(planted_etp)
    assert (planted_etp.code, oracle["verdict"]) == (1, "fail")
    assert oracle["checked"] == _moe_checked(*PLANTED_ETP_SIZES), "expert 7 misplaced, not duplicated"
    assert {f["tensor"] for f in oracle["findings"]} == {EXPERT_ROW, EXPERT_GATED, *SWAPPED}
    assert len(oracle["findings"]) == 15 + 11 + 4 * 6
    assert "--etp 2" in planted_etp.out and "--target-etp 1 --target-etp 2 --target-etp 4" in planted_etp.out
