"""Coverage counts every global Megatron parameter exactly once per model-parallel replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from convcheck.layout import RankCoord
from convcheck.oracles.coverage import exactly_once
from tests.support.helpers import mutant, run_cli

EXPERT = "decoder.layers.0.mlp.experts.local_experts.{}.linear_fc1.weight"
DENSE = "decoder.layers.0.self_attention.linear_qkv.weight"


def claim(rank: int, names: dict[str, int], expert: tuple[str, ...] = (), mtp: bool = False, **coord: int) -> dict:
    return {"rank": rank, "coord": RankCoord(**coord), "counts": names, "expert": sorted(expert), "mtp": mtp}


def test_legal_replicas_are_not_findings() -> None:
    """TP ranks, DP replicas (EP ranks holding dense parameters) and ETP ranks of one expert share names legally."""
    gathered = [
        claim(0, {DENSE: 1, EXPERT.format(0): 1}, (EXPERT.format(0),), tp_rank=0, ep_rank=0, etp_rank=0),
        claim(1, {DENSE: 1, EXPERT.format(0): 1}, (EXPERT.format(0),), tp_rank=1, ep_rank=0, etp_rank=1),
        claim(2, {DENSE: 1, EXPERT.format(1): 1}, (EXPERT.format(1),), tp_rank=0, ep_rank=1, etp_rank=0),
        claim(3, {DENSE: 1, EXPERT.format(1): 1}, (EXPERT.format(1),), tp_rank=1, ep_rank=1, etp_rank=1),
    ]
    assert exactly_once(gathered) == []


def test_an_expert_claimed_by_two_ep_ranks_is_named() -> None:
    name = EXPERT.format(0)
    findings = exactly_once([claim(0, {name: 1}, (name,), ep_rank=0), claim(1, {name: 1}, (name,), ep_rank=1)])
    assert [(f.tensor, f.kind) for f in findings] == [(name, "claimed-twice")]
    assert "2 different EP rank / PP stage owners (0/0, 1/0; ranks 0, 1)" in findings[0].message


def test_a_dense_parameter_on_two_pp_stages_or_twice_on_one_rank_is_named() -> None:
    findings = exactly_once([claim(0, {DENSE: 2}, pp_rank=0), claim(1, {DENSE: 1}, pp_rank=1)])
    assert sorted(f.message.split(" (")[0] for f in findings) == [
        "2 local tensors of rank 0 claim this global name",
        "claimed by 2 different PP stage owners",
    ]


def test_word_embeddings_on_the_mtp_stage_are_a_replica_elsewhere_a_second_owner() -> None:
    """megatron-core builds the word embeddings on the stage with MTP layers too (DeepSeek-V3 at PP2)."""
    emb, mtp = "embedding.word_embeddings.weight", "mtp.layers.0.enorm.weight"
    first = claim(0, {emb: 1, DENSE: 1}, pp_rank=0)
    assert exactly_once([first, claim(1, {emb: 1, mtp: 1}, mtp=True, pp_rank=1)]) == []
    findings = exactly_once([first, claim(1, {emb: 1}, pp_rank=1)])  # no MTP layers there: another owner
    assert [(f.tensor, f.kind) for f in findings] == [(emb, "claimed-twice")]
    twice = exactly_once([first, claim(1, {emb: 2, mtp: 1}, mtp=True, pp_rank=1)])
    assert [f.message for f in twice] == ["2 local tensors of rank 1 claim this global name"]


@pytest.mark.local_spec("its hook moves SequentialMLP experts between EP ranks")
@pytest.mark.ranks
def test_ep_rank_importing_another_ranks_experts_is_named(tmp_path: Path) -> None:
    hook = mutant("ownership", "ep_rank1_takes_rank0_experts")
    res = run_cli("verify", "--model", "tiny:qwen3-moe", "--ep", "2", "--oracle", "coverage", "--hook", hook,
                  tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    twice = {f["tensor"] for f in res.findings("coverage") if f["kind"] == "claimed-twice"}
    expected = {
        f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc{fc}.weight"
        for layer in (0, 1)
        for e in range(4)
        for fc in (1, 2)
    }
    assert twice == expected
    assert "claimed-twice" in res.out and "EP rank / PP stage owners (0/0, 1/0; ranks 0, 1)" in res.out
