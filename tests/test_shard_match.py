"""convcheck.rank.shard_match: the mapping oracle's shard check inside roundtrip's drain proves exactly the shards
`to_shard` gives, holds source tensors only until their parameter is whole, and leaves everything else to the
oracle."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from convcheck.layout import ParallelLayout, RankCoord
from convcheck.mappings.registry import MappingRegistry
from convcheck.mappings.simple import Gated, Replicated, Split
from convcheck.oracles import riders
from convcheck.rank import shard_match
from convcheck.rank.shard_match import ShardTap

TP2 = ParallelLayout(tp=2)


def _source() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        n: torch.randn(8, 4, generator=g).to(torch.bfloat16)
        for n in ("gate.weight", "up.weight", "dense.weight", "norm.weight")
    }


def _tap(
    source: dict[str, torch.Tensor], local: dict[str, torch.Tensor], coord: RankCoord, settle: bool = False
) -> ShardTap:
    """The tap over three parameters; `settle`: as the oracles start it, a parameter whose tensors no other needs
    checked as they come (fc1's two: held only until both are there)."""
    mappings = {
        "fc1": Gated(megatron="fc1", gate="gate.weight", up="up.weight"),
        "proj": Split(megatron="proj", hf="dense.weight", dim=1),
        "norm": Replicated(megatron="norm", hf="norm.weight"),
    }
    registry = MappingRegistry(architecture="test", mappings=mappings)
    reads: list[str] = []
    ctx = SimpleNamespace(layout=TP2, coord=coord, checkpoint=SimpleNamespace(tensors=source))
    tap = ShardTap(ctx=ctx, registry=registry, all_names=set(local), local=dict(local))
    tap.reader = SimpleNamespace(get=lambda n: reads.append(n) or source[n].clone())
    tap.reads = reads  # type: ignore[attr-defined]
    for name in local:
        tap.needs[name] = set(mappings[name].hf_names)
        for hf in mappings[name].hf_names:
            tap.users.setdefault(hf, set()).add(name)
    if settle:
        tap.settle()
        assert sorted(tap.alone) == ["dense.weight", "norm.weight"] and tap.parts["fc1"][0] == {
            "gate.weight",
            "up.weight",
        }
    return tap


def _shards(source: dict[str, torch.Tensor], coord: RankCoord) -> dict[str, torch.Tensor]:
    r = coord.tp_rank
    fc1 = torch.cat([source["gate.weight"].chunk(2)[r], source["up.weight"].chunk(2)[r]])
    return {"fc1": fc1, "proj": source["dense.weight"].chunk(2, dim=1)[r].clone(), "norm": source["norm.weight"]}


@pytest.mark.parametrize("settle", [False, True])
@pytest.mark.parametrize("tp_rank", [0, 1])
def test_correct_shards_are_proven_and_nothing_is_left_held(tp_rank: int, settle: bool) -> None:
    source, coord = _source(), RankCoord(tp_rank=tp_rank)
    local = _shards(source, coord)
    tap = _tap(source, local, coord, settle)
    for name in source:  # the export's order
        tap.offer(name, source[name])
    tap.finish()
    assert all(tap.is_proven(n, t) for n, t in local.items())
    assert tap.held == {} and tap.held_bytes == 0 and tap.users == {} and tap.parts == {} and tap.private == {}
    assert tap.reads == []  # every tensor came from the caller's read


@pytest.mark.parametrize("settle", [False, True])
def test_a_wrong_element_is_not_proven_and_the_rest_are(settle: bool) -> None:
    source, coord = _source(), RankCoord(tp_rank=1)
    local = _shards(source, coord)
    local["fc1"].view(torch.int16)[5, 2] ^= 1  # one bit of the up half's rank-1 rows
    tap = _tap(source, local, coord, settle)
    for name in source:
        tap.offer(name)  # another rank: the tap reads what it needs itself
    tap.finish()
    assert not tap.is_proven("fc1", local["fc1"])
    assert tap.is_proven("proj", local["proj"]) and tap.is_proven("norm", local["norm"])
    assert sorted(tap.reads) == sorted(source)


@pytest.mark.parametrize("settle", [False, True])
def test_a_shard_written_after_its_proof_is_checked_again(settle: bool) -> None:
    source, coord = _source(), RankCoord()
    local = _shards(source, coord)
    tap = _tap(source, local, coord, settle)
    for name in source:
        tap.offer(name, source[name])
    local["proj"].add_(1)  # an in-place write moves the version counter
    assert not tap.is_proven("proj", local["proj"])
    assert not tap.is_proven("norm", local["norm"].clone())  # another tensor of the same name is not the one proven


@pytest.mark.parametrize("settle", [False, True])
def test_a_name_the_export_never_yields_leaves_its_parameter_to_the_oracle(settle: bool) -> None:
    source, coord = _source(), RankCoord()
    local = _shards(source, coord)
    tap = _tap(source, local, coord, settle)
    for name in ("gate.weight", "dense.weight", "norm.weight"):  # up never comes
        tap.offer(name, source[name])
    assert tap.held_bytes > 0  # the gate half waits for its parameter's other tensor
    tap.finish()
    assert not tap.is_proven("fc1", local["fc1"]) and tap.is_proven("proj", local["proj"])
    assert tap.held == {} and tap.held_bytes == 0 and tap.parts == {} and tap.private == {}


@pytest.mark.parametrize("settle", [False, True])
def test_over_the_hold_budget_a_parameter_is_left_to_the_oracle(monkeypatch: pytest.MonkeyPatch, settle: bool) -> None:
    source, coord = _source(), RankCoord()
    local = _shards(source, coord)
    monkeypatch.setattr(shard_match, "HOLD_BYTES", source["gate.weight"].numel() * 2)  # one tensor's bytes
    tap = _tap(source, local, coord, settle)
    for name in source:
        tap.offer(name, source[name])
    tap.finish()
    assert not tap.is_proven("fc1", local["fc1"])  # needs two tensors at once
    assert tap.is_proven("proj", local["proj"]) and tap.is_proven("norm", local["norm"])
    assert tap.held == {} and tap.held_bytes == 0


def test_mapping_rides_on_source_reads_only_when_roundtrip_runs_before_it() -> None:
    assert "mapping" in riders(["coverage", "roundtrip", "logits", "mapping"])
    assert "mapping" not in riders(["mapping", "roundtrip"])
    assert "mapping" not in riders(["coverage", "mapping"])
    assert riders(["roundtrip"]) == frozenset()


@pytest.mark.parametrize("settle", [False, True])
@pytest.mark.parametrize("broken", ["norm", "fc1"])
def test_a_mapping_that_raises_is_left_to_the_oracle_and_the_drain_goes_on(broken: str, settle: bool) -> None:
    """Whatever a mapping raises inside roundtrip's drain stays out of roundtrip: the parameter is not proven, the
    others are, and nothing is left held (fc1's two tensors, held apart for it alone once settled, are let go)."""
    source, coord = _source(), RankCoord()
    local = _shards(source, coord)
    tap = _tap(source, local, coord, settle)
    names = tap.registry.mappings[broken].hf_names

    class Raising:
        hf_names = names

        def to_shard(self, *_: object) -> None:
            raise RuntimeError("a bug in a mapping")

        row_pieces = to_shard

    tap.registry.mappings[broken] = Raising()
    for name in source:
        tap.offer(name, source[name])
    tap.finish()
    assert not tap.is_proven(broken, local[broken])
    assert all(tap.is_proven(n, t) for n, t in local.items() if n != broken)
    assert tap.held == {} and tap.held_bytes == 0 and tap.parts == {} and tap.private == {}


def test_export_views_of_the_shard_itself_are_proven_only_where_they_sit_where_the_mapping_says() -> None:
    """TP1, no copy made: the export's gate / up are views of the very shard (compared without reading, as the same
    memory); the same views swapped are read and fail (same storage, other offsets)."""
    from convcheck.mappings.check import shard_matches

    source = _source()
    fc1 = torch.cat([source["gate.weight"], source["up.weight"]])
    gated = Gated(megatron="fc1", gate="gate.weight", up="up.weight")
    layout, coord = ParallelLayout(), RankCoord()
    assert shard_matches(gated, {"gate.weight": fc1[:8], "up.weight": fc1[8:]}, layout, coord, fc1)
    assert not shard_matches(gated, {"gate.weight": fc1[8:], "up.weight": fc1[:8]}, layout, coord, fc1)
