"""Explicit mappings as pure tensor functions: bitwise round trips, the bridge's QKV helpers, Megatron-Core's
GroupedMLP forward semantics against HF Qwen3-MoE experts, strict registry coverage, and planted bugs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from convcheck.compare.bits import compare_bits
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mappings import (
    CoverageError,
    FusedQKV,
    Gated,
    GroupedFc1,
    GroupedFc2,
    MappingError,
    RankCoord,
    Replicated,
    Split,
    roundtrip_findings,
)
from convcheck.models.mapping_registry import build_registry

H, G, D, HIDDEN = 8, 4, 4, 16  # query heads, query groups, head_dim, hidden
E, F = 8, 8  # experts, moe ffn
_next = [0]


def unique(*shape: int) -> torch.Tensor:
    """fp32 integers never repeated across tensors of one test session (misplacement shows in the bits)."""
    n = 1
    for s in shape:
        n *= s
    start = _next[0]
    _next[0] += n
    return torch.arange(start, start + n, dtype=torch.float32).reshape(shape)


def qkv(bias: bool = False) -> tuple[FusedQKV, dict[str, torch.Tensor]]:
    kind = "bias" if bias else "weight"
    m = FusedQKV(
        megatron=f"decoder.layers.0.self_attention.linear_qkv.{kind}",
        q=f"q.{kind}",
        k=f"k.{kind}",
        v=f"v.{kind}",
        num_heads=H,
        num_query_groups=G,
        head_dim=D,
    )
    rest = () if bias else (HIDDEN,)
    return m, {m.q: unique(H * D, *rest), m.k: unique(G * D, *rest), m.v: unique(G * D, *rest)}


def experts_hf(layer: int = 0) -> dict[str, torch.Tensor]:
    out = {}
    for e in range(E):
        p = f"model.layers.{layer}.mlp.experts.{e}."
        out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = unique(F, HIDDEN), unique(F, HIDDEN)
        out[p + "down_proj.weight"] = unique(HIDDEN, F)
    return out


def grouped(layer: int = 0, fc1_cls: type = GroupedFc1, fc2_cls: type = GroupedFc2) -> tuple[Any, Any]:
    t = f"model.layers.{layer}.mlp.experts.{{expert}}."
    fc1 = fc1_cls(
        megatron=f"decoder.layers.{layer}.mlp.experts.weight1",
        num_experts=E,
        hidden=HIDDEN,
        ffn=F,
        gate=t + "gate_proj.weight",
        up=t + "up_proj.weight",
    )
    fc2 = fc2_cls(
        megatron=f"decoder.layers.{layer}.mlp.experts.weight2",
        num_experts=E,
        hidden=HIDDEN,
        ffn=F,
        down=t + "down_proj.weight",
    )
    return fc1, fc2


# --- round trips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_qkv_roundtrip_bitwise(tp: int, bias: bool) -> None:
    m, hf = qkv(bias)
    assert roundtrip_findings(m, hf, ParallelLayout(tp=tp)) == []


def test_qkv_shard_is_whole_query_groups() -> None:
    m, hf = qkv()
    shard = m.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=1))
    n = H // G
    # rank 1 of 2 holds groups 2 and 3: [q4, q5, k2, v2, q6, q7, k3, v3]
    expect = torch.cat(
        [
            hf[m.q][4 * D : 6 * D],
            hf[m.k][2 * D : 3 * D],
            hf[m.v][2 * D : 3 * D],
            hf[m.q][6 * D : 8 * D],
            hf[m.k][3 * D : 4 * D],
            hf[m.v][3 * D : 4 * D],
        ]
    )
    assert n == 2 and compare_bits("shard", expect, shard) is None


def test_qkv_fewer_kv_heads_than_tp_splits_each_group() -> None:
    m, hf = qkv()
    layout = ParallelLayout(tp=8)  # G=4 < tp=8: each query group spans two ranks
    assert roundtrip_findings(m, hf, layout) == []
    shard = m.to_shard(hf, layout, RankCoord(tp_rank=1))
    # rank 1 holds the second half of group 0: [k0, v0]
    expect = torch.cat([hf[m.k][0:D], hf[m.v][0:D]])
    assert compare_bits("shard", expect, shard) is None


def test_qkv_rejects_groups_and_tp_that_do_not_divide() -> None:
    m = FusedQKV(
        megatron="decoder.layers.0.self_attention.linear_qkv.weight",
        q="q",
        k="k",
        v="v",
        num_heads=6,
        num_query_groups=3,
        head_dim=4,
    )
    with pytest.raises(MappingError, match="num_query_groups=3 and tp=2 do not divide one another"):
        m.to_shard({}, ParallelLayout(tp=2), RankCoord(tp_rank=0))


@pytest.mark.parametrize("ep,etp", list(itertools.product([1, 2, 4], [1, 2])))
def test_grouped_mlp_roundtrip_bitwise(ep: int, etp: int) -> None:
    hf = experts_hf()
    layout = ParallelLayout(ep=ep, etp=etp)
    fc1, fc2 = grouped()
    assert roundtrip_findings(fc1, hf, layout) == []
    assert roundtrip_findings(fc2, hf, layout) == []
    shard = fc1.to_shard(hf, layout, RankCoord(ep_rank=ep - 1, etp_rank=etp - 1))
    assert tuple(shard.shape) == (HIDDEN, (E // ep) * 2 * F // etp)
    assert tuple(fc2.to_shard(hf, layout, RankCoord(ep_rank=0)).shape) == ((E // ep) * F // etp, HIDDEN)


def test_grouped_mlp_export_streams_one_expert_at_a_time() -> None:
    hf = experts_hf()
    layout = ParallelLayout(ep=2, etp=2)
    fc1, _ = grouped()
    shards = {c: fc1.to_shard(hf, layout, c) for c in fc1.coords(layout)}
    names = [n for n, _ in fc1.from_shards(shards, layout)]
    assert names == [f"model.layers.0.mlp.experts.{e}.{p}_proj.weight" for e in range(E) for p in ("gate", "up")]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_dense_mappings_roundtrip_bitwise(tp: int) -> None:
    layout = ParallelLayout(tp=tp)
    hf = {"embed": unique(10, 4), "gate": unique(8, 4), "up": unique(8, 4), "down": unique(4, 8), "norm": unique(4)}
    for m in (
        Split(megatron="embedding.word_embeddings.weight", hf="embed", padded_rows=16, unpadded_rows=10),
        Gated(megatron="decoder.layers.0.mlp.linear_fc1.weight", gate="gate", up="up"),
        Split(megatron="decoder.layers.0.mlp.linear_fc2.weight", hf="down", dim=1),
        Replicated(megatron="decoder.final_layernorm.weight", hf="norm"),
    ):
        assert roundtrip_findings(m, hf, layout) == [], m.megatron
    embed = Split(megatron="e", hf="embed", padded_rows=16, unpadded_rows=10)
    last = embed.to_shard(hf, layout, RankCoord(tp_rank=tp - 1))
    first_pad = max(0, 10 - (tp - 1) * (16 // tp))  # vocab padding rows are zeros
    assert tuple(last.shape) == (16 // tp, 4) and int((last[first_pad:] != 0).sum()) == 0


@pytest.mark.parametrize("tp", [1, 2])
def test_gated_row_blocks_match_only_the_true_shard(tp: int) -> None:
    """The mapping oracle compares fc1 block by block (no concatenated copy): the true shard matches; one changed
    element in either block, or a shard of other rows, sends it to the whole-tensor compare."""
    from convcheck.compare.bits import bytes_equal
    from convcheck.mappings.check import rows_match

    layout = ParallelLayout(tp=tp)
    hf = {"gate": unique(8, 4), "up": unique(8, 4)}
    fc1 = Gated(megatron="decoder.layers.0.mlp.linear_fc1.weight", gate="gate", up="up")
    for rank in range(tp):
        coord = RankCoord(tp_rank=rank)
        shard = fc1.to_shard(hf, layout, coord)
        assert bytes_equal(torch.cat(fc1.row_pieces(hf, layout, coord)), shard)
        assert rows_match(fc1, hf, layout, coord, shard)
        for at in (0, shard.shape[0] - 1):
            bad = shard.clone()
            bad[at, 1] += 1
            assert not rows_match(fc1, hf, layout, coord, bad)
        assert not rows_match(fc1, hf, layout, coord, shard[:-1])
    embed = Split(megatron="e", hf="gate", padded_rows=8, unpadded_rows=8)
    assert embed.to_shard(hf, ParallelLayout(), RankCoord()).data_ptr() == hf["gate"].data_ptr()  # no padding copy


def test_row_blocks_in_place_are_equal_unread_and_misplaced_ones_are_read() -> None:
    """An export that is the shard's own rows (a view, as at TP1) matches without reading; views of the shard at the
    wrong rows (gate and up swapped in place), another dtype over the same bytes, or a transposed view do not, and
    a copy with one changed element is still read and refused."""
    from convcheck.mappings.check import rows_match

    layout, coord = ParallelLayout(), RankCoord()
    fc1 = Gated(megatron="decoder.layers.0.mlp.linear_fc1.weight", gate="gate", up="up")
    shard = unique(16, 4)
    assert rows_match(fc1, {"gate": shard[:8], "up": shard[8:]}, layout, coord, shard)
    assert not rows_match(fc1, {"gate": shard[8:], "up": shard[:8]}, layout, coord, shard)
    assert not rows_match(fc1, {"gate": shard[:8].view(torch.int32), "up": shard[8:].view(torch.int32)}, layout,
                          coord, shard)  # fmt: skip
    square = unique(8, 8)
    assert not rows_match(fc1, {"gate": square.t()[:4], "up": square.t()[4:]}, layout, coord, square)
    copy = shard.clone()
    assert rows_match(fc1, {"gate": copy[:8], "up": copy[8:]}, layout, coord, shard)
    copy[12, 3] += 1
    assert not rows_match(fc1, {"gate": copy[:8], "up": copy[8:]}, layout, coord, shard)


@pytest.mark.parametrize("ep,etp", [(1, 1), (2, 2), (4, 1)])
def test_sequential_expert_mappings_use_global_ids(ep: int, etp: int) -> None:
    hf = experts_hf()
    layout = ParallelLayout(ep=ep, etp=etp)
    p = "model.layers.0.mlp.experts.5."
    fc1 = Gated(
        megatron="decoder.layers.0.mlp.experts.local_experts.5.linear_fc1.weight",
        axis="etp",
        expert=5,
        num_experts=E,
        gate=p + "gate_proj.weight",
        up=p + "up_proj.weight",
    )
    fc2 = Split(
        megatron="decoder.layers.0.mlp.experts.local_experts.5.linear_fc2.weight",
        axis="etp",
        dim=1,
        expert=5,
        num_experts=E,
        hf=p + "down_proj.weight",
    )
    assert roundtrip_findings(fc1, hf, layout) == [] and roundtrip_findings(fc2, hf, layout) == []
    if ep > 1:
        with pytest.raises(MappingError, match="expert 5 lives on ep_rank"):
            fc1.to_shard(hf, layout, RankCoord(ep_rank=0))


# --- against the bridge's real QKV helpers ------------------------------------------------------------


@pytest.fixture(scope="module")
def bridge_qkv_helpers() -> Any:
    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge.models.conversion import param_mapping

    return param_mapping


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_qkv_agrees_with_bridge_merge_and_split(bridge_qkv_helpers: Any, tp: int) -> None:
    pm = bridge_qkv_helpers
    config = SimpleNamespace(num_attention_heads=H, num_query_groups=G, kv_channels=D, hidden_size=HIDDEN)
    layout = ParallelLayout(tp=tp)
    for bias in (False, True):
        m, hf = qkv(bias)
        ours = torch.cat([m.to_shard(hf, layout, c) for c in m.coords(layout)])
        merge = pm.merge_qkv_biases if bias else pm.merge_qkv_weights
        split = pm.split_qkv_biases if bias else pm.split_qkv_weights
        theirs = merge(config, hf[m.q], hf[m.k], hf[m.v])
        assert compare_bits(m.megatron, theirs, ours) is None
        shards = {c: t for c, t in zip(m.coords(layout), ours.chunk(tp))}
        for (name, t), b in zip(m.from_shards(shards, layout), split(config, theirs)):
            assert compare_bits(name, b.contiguous(), t) is None


# --- GroupedMLP functional test: Megatron-Core 0.16.1 view semantics vs HF Qwen3-MoE experts ---------


def grouped_mlp_forward(
    shards1: dict, shards2: dict, layout: ParallelLayout, x: torch.Tensor, top_idx: torch.Tensor, top_w: torch.Tensor
) -> torch.Tensor:
    """GroupedMLP.forward on every (EP, ETP) rank: w1 = weight1.view(E_local, hidden, -1), glu,
    w2 = weight2.view(E_local, -1, hidden); the ETP partial sums are added (the reduce-scatter)."""
    local = E // layout.ep
    out = torch.zeros_like(x)
    for coord, w1flat in shards1.items():
        w1 = w1flat.view(local, HIDDEN, -1)
        w2 = shards2[coord].view(local, -1, HIDDEN)
        for le in range(local):
            expert = coord.ep_rank * local + le
            tok, slot = torch.where(top_idx == expert)
            if tok.numel() == 0:
                continue
            h = x[tok] @ w1[le]
            a, b = torch.chunk(h, 2, dim=-1)
            y = (torch.nn.functional.silu(a) * b) @ w2[le]
            out.index_add_(0, tok, y * top_w[tok, slot, None])
    return out


def hf_experts(seed: int = 0) -> tuple[Any, dict[str, torch.Tensor]]:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(
        hidden_size=HIDDEN, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=2, hidden_act="silu"
    )
    experts = Qwen3MoeExperts(config).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(experts.gate_up_proj.shape, generator=g))
        experts.down_proj.copy_(torch.randn(experts.down_proj.shape, generator=g))
    hf = {}
    for e in range(E):  # the on-disk per-expert tensors: gate_up_proj[e] = [gate; up]
        p = f"model.layers.0.mlp.experts.{e}."
        hf[p + "gate_proj.weight"] = experts.gate_up_proj[e, :F].detach().clone()
        hf[p + "up_proj.weight"] = experts.gate_up_proj[e, F:].detach().clone()
        hf[p + "down_proj.weight"] = experts.down_proj[e].detach().clone()
    return experts, hf


def functional_max_error(layout: ParallelLayout, fc1: Any, fc2: Any) -> float:
    """max |Megatron - HF| / max |HF| over 32 tokens routed top-2 (fp32)."""
    experts, hf = hf_experts()
    g = torch.Generator().manual_seed(1)
    tokens = 32
    x = torch.randn(tokens, HIDDEN, generator=g)
    top_idx = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(tokens)])
    top_w = torch.softmax(torch.randn(tokens, 2, generator=g), dim=-1)
    with torch.no_grad():
        expect = experts(x, top_idx, top_w)
        coords = fc1.coords(layout)
        shards1 = {c: fc1.to_shard(hf, layout, c) for c in coords}
        shards2 = {c: fc2.to_shard(hf, layout, c) for c in coords}
        got = grouped_mlp_forward(shards1, shards2, layout, x, top_idx, top_w)
    return float((got - expect).abs().max() / expect.abs().max())


@pytest.mark.parametrize("ep,etp", [(1, 1), (2, 1), (2, 2), (4, 2)])
def test_grouped_mlp_matches_hf_qwen3_moe_experts(ep: int, etp: int) -> None:
    fc1, fc2 = grouped()
    err = functional_max_error(ParallelLayout(ep=ep, etp=etp), fc1, fc2)
    assert err <= 1e-6, f"max |Megatron GroupedMLP - HF experts| / max |HF| = {err}"


# --- registry coverage ---------------------------------------------------------------------------------


def qwen3_moe_names(layers: int = 2, grouped_experts: bool = False) -> tuple[list[str], list[str]]:
    meg = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight"]
    hf = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(layers):
        d, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        meg += [
            d + s
            for s in (
                "input_layernorm.weight",
                "pre_mlp_layernorm.weight",
                "self_attention.linear_qkv.weight",
                "self_attention.q_layernorm.weight",
                "self_attention.k_layernorm.weight",
                "self_attention.linear_proj.weight",
                "mlp.router.weight",
            )
        ]
        hf += [
            h + s
            for s in (
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
                "self_attn.q_norm.weight",
                "self_attn.k_norm.weight",
                "self_attn.o_proj.weight",
                "mlp.gate.weight",
            )
        ]
        if grouped_experts:
            meg += [d + "mlp.experts.weight1", d + "mlp.experts.weight2"]
        for e in range(E):
            if not grouped_experts:
                meg += [d + f"mlp.experts.local_experts.{e}.linear_fc{i}.weight" for i in (1, 2)]
            hf += [h + f"mlp.experts.{e}.{p}_proj.weight" for p in ("gate", "up", "down")]
    return meg, hf


GEOM = Geometry(
    hidden=HIDDEN, num_heads=H, num_query_groups=G, head_dim=D, vocab=10, padded_vocab=16, num_experts=E, moe_ffn=F
)


@pytest.mark.parametrize("grouped_experts", [False, True])
def test_registry_covers_qwen3_moe_exactly_once(grouped_experts: bool) -> None:
    meg, hf = qwen3_moe_names(grouped_experts=grouped_experts)
    reg = build_registry("Qwen3MoeForCausalLM", GEOM, meg, hf)
    assert sorted(reg.mappings) == sorted(meg) and reg.problems == ()


def test_a_rule_is_tried_only_on_names_ending_in_its_literal_tail() -> None:
    from convcheck.mappings.registry import literal_tail

    assert literal_tail(r"decoder\.layers\.(\d+)\.mlp\.linear_fc1\.weight") == ".mlp.linear_fc1.weight"
    assert literal_tail(r"a\.(?:weight)") == "a.weight"
    assert literal_tail(r"a\.(weight|bias)") == "" and literal_tail(r"x\.w$") == "" and literal_tail("(?i)abc") == ""


def test_a_rule_is_tried_only_on_names_holding_its_literal_runs() -> None:
    from convcheck.mappings.registry import literal_runs
    from convcheck.models.shared_mappings import LAYER_PREFIX, expert_weight

    assert literal_runs(LAYER_PREFIX + expert_weight(1)) == ("decoder.layers.", ".mlp.experts.")
    assert literal_runs(r"a\.(x|y)\.b\d+c") == ("a.", ".b", "c")
    assert literal_runs(r"(a|b)") == () and literal_runs("(?i)abc") == ()


def test_rules_by_tail_match_names_shorter_than_the_longest_tail() -> None:
    """Names shorter than the longest literal tail, names sharing their ends, and a rule without a tail are each
    matched by exactly the rules a full match finds (the registry groups names by their last characters)."""
    from convcheck.mappings.registry import MappingRule, registry_from_rules

    def rule(pattern: str) -> MappingRule:
        return MappingRule(pattern, lambda m, g: Replicated(megatron=m[0], hf=f"hf.{m[0]}"))

    rules = [rule(r"w"), rule(r"b\.w"), rule(r"layers\.\d+\.long_tail_name\.weight"), rule(r"(x|y)")]
    names = ["w", "b.w", "x", "y", "layers.1.long_tail_name.weight", "layers.22.long_tail_name.weight", "z.w"]
    reg = registry_from_rules("T", rules, GEOM, names, [f"hf.{n}" for n in names], strict=False)
    assert sorted(reg.mappings) == sorted(n for n in names if n != "z.w")
    assert reg.problems == ("hf.z.w: HF tensor would be produced 0 times", "z.w: Megatron parameter has no mapping")


def test_registry_names_every_offender() -> None:
    meg, hf = qwen3_moe_names()
    meg = meg + ["decoder.layers.0.mlp.mystery.weight"]
    hf = [n for n in hf if n != "model.layers.1.mlp.experts.3.up_proj.weight"] + ["model.layers.0.extra.weight"]
    with pytest.raises(CoverageError) as info:
        build_registry("Qwen3MoeForCausalLM", GEOM, meg, hf)
    text = str(info.value)
    assert "decoder.layers.0.mlp.mystery.weight: Megatron parameter has no mapping" in text
    assert "model.layers.0.extra.weight: HF tensor would be produced 0 times" in text
    assert "model.layers.1.mlp.experts.3.up_proj.weight: produced by a mapping but not an HF tensor" in text
    both = meg[:-1] + ["decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"]  # fused and unfused norm
    twice = "model.layers.0.input_layernorm.weight: HF tensor would be produced 2 times"
    with pytest.raises(CoverageError, match=twice):
        build_registry("Qwen3MoeForCausalLM", GEOM, both, qwen3_moe_names()[1])


# --- planted bugs: each must be caught, naming the tensor ---------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class InterleavedFc1(GroupedFc1):
    """Bug: treats weight1 as `[hidden, E * 2F/etp]` with expert e in column block e (not expert-major memory)."""

    def to_shard(self, hf: Any, layout: ParallelLayout, coord: RankCoord) -> Any:
        n = self.local_experts(layout)
        ids = [self.global_expert(layout, coord.ep_rank, e) for e in range(n)]
        blocks = [self.expert_block(hf, e, layout, coord.etp_rank) for e in ids]
        return torch.cat(blocks, dim=1).contiguous()


@dataclass(frozen=True, kw_only=True, slots=True)
class InterleavedBothWays(InterleavedFc1):
    """Bug made symmetrically: the export reads column blocks too, so a round trip cannot see it."""

    def from_shards(self, shards: Any, layout: ParallelLayout) -> Any:
        n, width = self.local_experts(layout), 2 * self.ffn // layout.etp
        for ep_rank in range(layout.ep):
            for local in range(n):
                rows = [
                    shards[RankCoord(ep_rank=ep_rank, etp_rank=r)][:, local * width : (local + 1) * width].t()
                    for r in range(layout.etp)
                ]
                e = self.global_expert(layout, ep_rank, local)
                yield self.gate.format(expert=e), torch.cat([x[: width // 2] for x in rows]).contiguous()
                yield self.up.format(expert=e), torch.cat([x[width // 2 :] for x in rows]).contiguous()


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalIdFc2(GroupedFc2):
    """Bug: the export names experts by their local id on each EP rank."""

    def from_shards(self, shards: Any, layout: ParallelLayout) -> Any:
        n = self.local_experts(layout)
        for i, (_name, t) in enumerate(GroupedFc2.from_shards(self, shards, layout)):
            yield self.down.format(expert=i % n), t


@dataclass(frozen=True, kw_only=True, slots=True)
class WrongHalfFc1(GroupedFc1):
    """Bug: ETP rank r takes the gate slice of rank etp-1-r (wrong half of the gate rows)."""

    def expert_block(self, hf: Any, expert: int, layout: ParallelLayout, etp_rank: int) -> Any:
        from convcheck.mappings.base import chunk

        gate, up = hf[self.gate.format(expert=expert)], hf[self.up.format(expert=expert)]
        wrong = layout.etp - 1 - etp_rank
        return torch.cat([chunk(gate, layout.etp, wrong, 0), chunk(up, layout.etp, etp_rank, 0)]).t()


def test_plant_interleaved_layout_caught_by_roundtrip() -> None:
    fc1, _ = grouped(fc1_cls=InterleavedFc1)
    found = roundtrip_findings(fc1, experts_hf(), ParallelLayout(ep=2))
    assert found and found[0].kind == "bytes-differ"
    assert found[0].tensor == "model.layers.0.mlp.experts.0.gate_proj.weight"
    assert "first at index" in found[0].message


def test_plant_symmetric_interleaved_layout_caught_by_forward() -> None:
    fc1, fc2 = grouped(fc1_cls=InterleavedBothWays)
    layout = ParallelLayout(ep=2)
    assert roundtrip_findings(fc1, experts_hf(), layout) == []  # invisible to a round trip ...
    assert functional_max_error(layout, fc1, fc2) > 1e-2  # ... but not to Megatron-Core's forward


def test_plant_local_expert_id_caught_by_roundtrip_names() -> None:
    _, fc2 = grouped(fc2_cls=LocalIdFc2)
    found = {(f.tensor, f.kind) for f in roundtrip_findings(fc2, experts_hf(), ParallelLayout(ep=2))}
    assert ("model.layers.0.mlp.experts.4.down_proj.weight", "missing") in found
    assert ("model.layers.0.mlp.experts.0.down_proj.weight", "duplicate") in found


def test_plant_local_expert_id_caught_by_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        GroupedFc2,
        "hf_names",
        property(
            lambda self: tuple(self.down.format(expert=e % (self.num_experts // 2)) for e in range(self.num_experts))
        ),
    )
    meg, hf = qwen3_moe_names(grouped_experts=True)
    never = r"model\.layers\.0\.mlp\.experts\.7\.down_proj\.weight: HF tensor would be produced 0 times"
    with pytest.raises(CoverageError, match=never):
        build_registry("Qwen3MoeForCausalLM", GEOM, meg, hf)


def test_plant_wrong_etp_half_caught_by_roundtrip() -> None:
    fc1, _ = grouped(fc1_cls=WrongHalfFc1)
    found = roundtrip_findings(fc1, experts_hf(), ParallelLayout(etp=2))
    assert [f.tensor for f in found][:1] == ["model.layers.0.mlp.experts.0.gate_proj.weight"]
    assert all(f.tensor.endswith("gate_proj.weight") for f in found)


def test_registry_maps_te_grouped_expert_names_with_global_ids() -> None:
    meg, hf = qwen3_moe_names()
    te = [
        n.replace(f"local_experts.{e}.linear_fc{i}.weight", f"linear_fc{i}.weight{e}")
        for n in meg
        for e in range(E)
        for i in (1, 2)
        if f"local_experts.{e}.linear_fc{i}." in n
    ]
    meg = [n for n in meg if "local_experts" not in n] + te
    reg = build_registry("Qwen3MoeForCausalLM", GEOM, meg, hf)
    m = reg.get("decoder.layers.1.mlp.experts.linear_fc1.weight6")
    assert (
        isinstance(m, Gated)
        and m.expert == 6
        and m.hf_names
        == ("model.layers.1.mlp.experts.6.gate_proj.weight", "model.layers.1.mlp.experts.6.up_proj.weight")
    )
    assert roundtrip_findings(m, experts_hf(layer=1), ParallelLayout(ep=2, etp=2)) == []
