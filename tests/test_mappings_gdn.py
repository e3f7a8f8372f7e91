"""Gated-DeltaNet and gated-attention mappings as pure functions (rows written out per TP rank, bitwise round trips),
the Qwen3-Next / Qwen3.5 registries without ranks, and bugs planted in the real bridge that the mapping oracle
catches by tensor and first wrong element."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from convcheck.compare.bits import compare_bits
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mappings import (
    Blocks,
    FusedQKV,
    GDNInProj,
    GDNWidths,
    MappingError,
    RankCoord,
    ZeroCentered,
    gdn_conv1d,
    roundtrip_findings,
)
from convcheck.mappings.gdn import group_ba, group_qkvz
from convcheck.models.mapping_registry import build_registry
from tests.support.helpers import run_cli

W = GDNWidths(key_heads=2, value_heads=4, key_dim=8, value_dim=8)  # the tiny fixtures' widths: r = 2
QK, V, HIDDEN = 16, 32, 4


def labels(n: int, offset: int = 0) -> torch.Tensor:
    """`[n, HIDDEN]`; row i holds (offset + i) * 100 + column: a misplaced row shows which HF row it was."""
    return ((torch.arange(n)[:, None] + offset) * 100 + torch.arange(HIDDEN)[None, :]).float()


def row_ids(shard: torch.Tensor) -> list[int]:
    return (shard[:, 0] / 100).long().tolist()


def fused() -> tuple[GDNInProj, dict[str, torch.Tensor]]:
    """Qwen3-Next: in_proj_qkvz rows 0..95 (48 per key head), in_proj_ba rows labelled 1000..1007 (4 per key head)."""
    m = GDNInProj(megatron="decoder.layers.1.self_attention.in_proj.weight", hf=("qkvz", "ba"), widths=W)
    return m, {"qkvz": labels(96), "ba": labels(8, 1000)}


def separate() -> tuple[GDNInProj, dict[str, torch.Tensor]]:
    """Qwen3.5: qkv rows 0..63, z 1000.., b 2000.., a 3000.."""
    m = GDNInProj(megatron="decoder.layers.1.self_attention.in_proj.weight", hf=("qkv", "z", "b", "a"), widths=W)
    return m, {"qkv": labels(64), "z": labels(32, 1000), "b": labels(4, 2000), "a": labels(4, 3000)}


def test_fused_in_proj_rank_s_holds_key_head_s_then_its_b_a() -> None:
    """At TP2 rank s holds key head s: its 48 qkvz rows [q_s, k_s, v_s, z_s] then its ba rows [b_s, a_s]."""
    m, hf = fused()
    for s in range(2):
        shard = m.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=s))
        assert row_ids(shard) == [*range(48 * s, 48 * s + 48), *range(1000 + 4 * s, 1004 + 4 * s)]


def test_fused_in_proj_tp1_is_q_k_v_z_b_a_of_both_key_heads() -> None:
    m, hf = fused()
    h0, h1 = 0, 48  # first qkvz row of each key head
    want = [*range(h0, h0 + 8), *range(h1, h1 + 8), *range(h0 + 8, h0 + 16), *range(h1 + 8, h1 + 16),  # q, k
            *range(h0 + 16, h0 + 32), *range(h1 + 16, h1 + 32), *range(h0 + 32, h0 + 48), *range(h1 + 32, h1 + 48),
            1000, 1001, 1004, 1005, 1002, 1003, 1006, 1007]  # fmt: skip
    assert row_ids(m.to_shard(hf, ParallelLayout(), RankCoord())) == want


def test_separate_in_proj_rank_s_holds_its_slice_of_each_component() -> None:
    m, hf = separate()
    s = 1
    shard = m.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=s))
    assert row_ids(shard) == [*range(8, 16), *range(24, 32), *range(48, 64), *range(1016, 1032), 2002, 2003,
                              3002, 3003]  # fmt: skip


def test_fused_and_separate_give_the_same_shards() -> None:
    """The same weights stored both ways (grouped per key head by our own group_qkvz / group_ba) shard alike."""
    sep, hf = separate()
    q, k, v = hf["qkv"].split([QK, QK, V])
    grouped = {"qkvz": group_qkvz(q, k, v, hf["z"], W), "ba": group_ba(hf["b"], hf["a"], W)}
    fus = GDNInProj(megatron=sep.megatron, hf=("qkvz", "ba"), widths=W)
    for tp in (1, 2):
        for s in range(tp):
            coord = RankCoord(tp_rank=s)
            layout = ParallelLayout(tp=tp)
            assert torch.equal(fus.to_shard(grouped, layout, coord), sep.to_shard(hf, layout, coord))


def test_conv1d_rank_s_holds_its_q_k_v_channels() -> None:
    m = gdn_conv1d(megatron="decoder.layers.1.self_attention.conv1d.weight", hf="conv", widths=W)
    hf = {"conv": labels(64)[:, :, None].expand(64, HIDDEN, 4)[:, :1].contiguous()}  # [64, 1, kernel 4]
    shard = m.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=1))
    assert tuple(shard.shape) == (32, 1, 4)
    assert (shard[:, 0, 0] / 100).long().tolist() == [*range(8, 16), *range(24, 32), *range(48, 64)]


def test_gated_qkv_group_is_q_heads_gate_heads_k_v() -> None:
    """q_proj [4 heads * 2 * 8]: head h rows [16h, 16h+8) are its query, [16h+8, 16h+16) its gate; TP2 rank g holds
    group g = heads 2g, 2g+1: [q, q, gate, gate, k_g, v_g] (megatron-core attention.py:1829-1866)."""
    m = FusedQKV(megatron="decoder.layers.0.self_attention.linear_qkv.weight", q="q", k="k", v="v", num_heads=4,
                 num_query_groups=2, head_dim=8, output_gate=True)  # fmt: skip
    hf = {"q": labels(64), "k": labels(16, 1000), "v": labels(16, 2000)}
    for g in range(2):
        a, b = 32 * g, 32 * g + 16  # the group's two heads
        want = [*range(a, a + 8), *range(b, b + 8), *range(a + 8, a + 16), *range(b + 8, b + 16),
                *range(1000 + 8 * g, 1008 + 8 * g), *range(2000 + 8 * g, 2008 + 8 * g)]  # fmt: skip
        assert row_ids(m.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=g))) == want
    for tp in (1, 2, 4):  # tp 4 > 2 groups: each group split over two ranks
        assert roundtrip_findings(m, hf, ParallelLayout(tp=tp)) == []


def test_out_norm_is_hf_minus_one_in_bf16() -> None:
    m = ZeroCentered(megatron="decoder.layers.1.self_attention.out_norm.weight", hf="norm")
    hf = {"norm": torch.tensor([1.0, 0.5, 1.984375, 1.0078125], dtype=torch.bfloat16)}
    shard = m.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=1))
    assert shard.dtype == torch.bfloat16 and shard.tolist() == [0.0, -0.5, 0.984375, 0.0078125]
    assert roundtrip_findings(m, hf, ParallelLayout(tp=2)) == []


@pytest.mark.parametrize("tp", [1, 2])
def test_gdn_mappings_roundtrip_bitwise(tp: int) -> None:
    layout = ParallelLayout(tp=tp)
    conv = gdn_conv1d(megatron="l.conv1d.weight", hf="conv", widths=W)
    for mapping, hf in (fused(), separate(), (conv, {"conv": torch.randn(64, 1, 4)})):
        assert roundtrip_findings(mapping, hf, layout) == [], mapping.hf_names


def test_refuses_key_heads_tp_does_not_divide() -> None:
    m, hf = fused()
    with pytest.raises(MappingError, match=r"in_proj\.weight: linear_num_key_heads=2 is not divisible by tp=4"):
        m.to_shard(hf, ParallelLayout(tp=4), RankCoord(tp_rank=0))
    with pytest.raises(MappingError, match="linear_num_value_heads=3 is not a multiple of 2"):
        GDNWidths(key_heads=2, value_heads=3, key_dim=8, value_dim=8)


def test_planted_b_a_swap_is_caught_at_the_first_b_row() -> None:
    """A shard whose beta and alpha sections are exchanged disagrees with ours first at row q+k+v+z of the rank."""
    m, hf = fused()
    layout = ParallelLayout(tp=2)
    coord = RankCoord(tp_rank=1)
    q, k, v, z, b, a = m.to_shard(hf, layout, coord).split([8, 8, 16, 16, 2, 2])
    finding = compare_bits(m.megatron, m.to_shard(hf, layout, coord), torch.cat([q, k, v, z, a, b]))
    assert finding is not None and finding.tensor == m.megatron and finding.detail["first_index"] == [48, 0]


# ---- the family registries, without ranks ----------------------------------------------------------------------------

ATTENTION = ("self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.weight",
             "self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight",
             "self_attention.linear_proj.weight")  # fmt: skip
GDN = ("self_attention.in_proj.layer_norm_weight", "self_attention.in_proj.weight", "self_attention.conv1d.weight",
       "self_attention.A_log", "self_attention.dt_bias", "self_attention.out_norm.weight",
       "self_attention.out_proj.weight")  # fmt: skip
DENSE = ("mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight")


def moe(grouped: bool) -> tuple[str, ...]:
    spelled = "mlp.experts.linear_fc{i}.weight{e}" if grouped else "mlp.experts.local_experts.{e}.linear_fc{i}.weight"
    experts = [spelled.format(e=e, i=i) for e in range(8) for i in (1, 2)]
    return ("pre_mlp_layernorm.weight", "mlp.router.weight", "mlp.shared_experts.linear_fc1.weight",
            "mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.gate_weight", *experts)  # fmt: skip


def megatron_names(mlp: tuple[str, ...]) -> list[str]:
    """The TE-named parameters of the tiny fixtures (schedule full, linear, linear, full; one attention MTP layer)."""
    names = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight"]
    for layer, mixer in enumerate((ATTENTION, GDN, GDN, ATTENTION)):
        names += [f"decoder.layers.{layer}.{p}" for p in (*mixer, *mlp)]
    names += [f"mtp.layers.0.{p}.weight" for p in ("enorm", "hnorm", "eh_proj", "final_layernorm")]
    return names + [f"mtp.layers.0.mtp_model_layer.{p}" for p in (*ATTENTION, *mlp)]


def fixture(name: str) -> tuple[Geometry, list[str]]:
    from convcheck.fixtures.build import build_fixture
    from convcheck.hf.checkpoint import open_checkpoint

    checkpoint = open_checkpoint(build_fixture(f"tiny:{name}"))
    return Geometry.from_hf_config(checkpoint.config), sorted(checkpoint.tensors)


@pytest.mark.parametrize(
    ("name", "architecture", "mlp", "count"),
    [
        ("qwen3-next", "Qwen3NextForCausalLM", moe(grouped=False), 141),
        ("qwen3.5", "Qwen3_5ForCausalLM", DENSE, 51),
        ("qwen3.5-moe", "Qwen3_5MoeForCausalLM", moe(grouped=True), 141),
    ],
)
def test_registry_covers_the_fixture_exactly_once(
    name: str, architecture: str, mlp: tuple[str, ...], count: int
) -> None:
    geometry, hf = fixture(name)
    meg = megatron_names(mlp)
    registry = build_registry(architecture, geometry, meg, hf)
    assert len(meg) == count and set(registry.mappings) == set(meg) and registry.problems == ()
    in_proj = registry.get("decoder.layers.2.self_attention.in_proj.weight")
    parts = ("qkvz", "ba") if name == "qwen3-next" else ("qkv", "z", "b", "a")
    assert in_proj.hf_names == tuple(f"model.layers.2.linear_attn.in_proj_{p}.weight" for p in parts)
    assert isinstance(registry.get("decoder.layers.1.self_attention.conv1d.weight"), Blocks)
    qkv = registry.get("mtp.layers.0.mtp_model_layer.self_attention.linear_qkv.weight")
    assert qkv.output_gate and qkv.q == "mtp.layers.0.self_attn.q_proj.weight"
    assert registry.get("mtp.layers.0.enorm.weight").hf == "mtp.pre_fc_norm_embedding.weight"
    assert registry.get("mtp.layers.0.hnorm.weight").hf == "mtp.pre_fc_norm_hidden.weight"


def test_geometry_reads_the_gdn_widths_and_the_output_gate() -> None:
    geometry, _ = fixture("qwen3.5")
    got = (geometry.linear_key_heads, geometry.linear_value_heads, geometry.linear_key_dim, geometry.linear_value_dim,
           geometry.linear_conv_kernel, geometry.attention_output_gate)  # fmt: skip
    assert got == (2, 4, 8, 8, 4, True)
    explicit = {"model_type": "qwen3_next", "attention_output_gate": False}
    assert not Geometry.from_hf_config(explicit).attention_output_gate
    assert not Geometry.from_hf_config({"model_type": "qwen3"}).attention_output_gate


# ---- bugs planted in the real bridge, through the CLI -------------------------------------------------------------

HOOKS = Path(__file__).parent / "support" / "hooks_gdn.py"


@pytest.mark.ranks
def test_symmetric_in_proj_b_a_swap_passes_roundtrip_but_not_mapping(tmp_path: Path) -> None:
    """Qwen3-Next TP1: beta and alpha exchanged in Megatron's in_proj on import and export alike."""
    res = run_cli("verify", "--model", "tiny:qwen3-next", "--oracle", "roundtrip,mapping",
                  "--hook", f"{HOOKS}:in_proj_ba_swapped", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    assert res.verdicts() == {"roundtrip": "pass", "mapping": "fail"}
    findings = res.findings("mapping")
    assert [(f["tensor"], f["kind"]) for f in findings] == [
        ("decoder.layers.1.self_attention.in_proj.weight", "import-bytes-differ"),
        ("decoder.layers.2.self_attention.in_proj.weight", "import-bytes-differ"),
        ("model.layers.1.linear_attn.in_proj_ba.weight", "export-bytes-differ"),
        ("model.layers.2.linear_attn.in_proj_ba.weight", "export-bytes-differ"),
    ]
    assert findings[0]["detail"]["first_index"] == [96, 0]  # q, k [16 each], v, z [32 each], then b


@pytest.mark.ranks
def test_symmetric_conv1d_q_k_swap_passes_roundtrip_but_not_mapping(tmp_path: Path) -> None:
    """Qwen3.5 TP1: the conv1d filters of q and k exchanged on import and export alike."""
    res = run_cli("verify", "--model", "tiny:qwen3.5", "--oracle", "roundtrip,mapping",
                  "--hook", f"{HOOKS}:conv1d_qk_swapped", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    assert res.verdicts() == {"roundtrip": "pass", "mapping": "fail"}
    findings = res.findings("mapping")
    assert [(f["tensor"], f["kind"]) for f in findings] == [
        ("decoder.layers.1.self_attention.conv1d.weight", "import-bytes-differ"),
        ("decoder.layers.2.self_attention.conv1d.weight", "import-bytes-differ"),
        ("model.layers.1.linear_attn.conv1d.weight", "export-bytes-differ"),
        ("model.layers.2.linear_attn.conv1d.weight", "export-bytes-differ"),
    ]
    assert findings[0]["detail"]["first_index"] == [0, 0, 0]


@pytest.mark.parametrize("tp", [1, 2])
def test_agrees_with_the_bridge_merge_helpers(tp: int) -> None:
    """Our shards, concatenated by rank, equal the pinned bridge's merge_gdn_linear_weights and gated
    merge_qkv_weights (the helpers both its import and export build on) on the same HF tensors."""
    from types import SimpleNamespace

    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge.models.conversion import param_mapping as pm

    layout = ParallelLayout(tp=tp)
    config = SimpleNamespace(hidden_size=HIDDEN, linear_key_head_dim=8, linear_value_head_dim=8,
                             linear_num_key_heads=2, linear_num_value_heads=4, num_attention_heads=4,
                             num_query_groups=2, kv_channels=8, attention_output_gate=True)  # fmt: skip
    m, hf = fused()
    ours = torch.cat([m.to_shard(hf, layout, c) for c in m.coords(layout)])
    assert compare_bits(m.megatron, pm.merge_gdn_linear_weights(config, hf["qkvz"], hf["ba"], tp_size=tp), ours) is None
    qkv = FusedQKV(megatron="linear_qkv.weight", q="q", k="k", v="v", num_heads=4, num_query_groups=2, head_dim=8,
                   output_gate=True)  # fmt: skip
    hf = {"q": labels(64), "k": labels(16, 1000), "v": labels(16, 2000)}
    ours = torch.cat([qkv.to_shard(hf, layout, c) for c in qkv.coords(layout)])
    assert compare_bits(qkv.megatron, pm.merge_qkv_weights(config, hf["q"], hf["k"], hf["v"]), ours) is None
