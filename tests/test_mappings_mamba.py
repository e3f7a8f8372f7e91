"""Mamba mappings as pure functions: exact row placement, bitwise round trips at TP 1/2/4, the NemotronH registry,
and a planted dt-before-B/C layout caught with the tensor named."""

from __future__ import annotations

import pytest
import torch

from convcheck.compare.bits import compare_bits
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mappings import (
    Blocks,
    CoverageError,
    MappingError,
    RankCoord,
    Split,
    mamba_conv1d,
    mamba_in_proj,
    roundtrip_findings,
)
from convcheck.models.mapping_registry import build_registry

HEADS, HEAD_DIM, GROUPS, STATE, HIDDEN, K = 8, 2, 4, 3, 6, 4  # d = 16, G*N = 12
D, GN = HEADS * HEAD_DIM, GROUPS * STATE
DIMS = {"heads": HEADS, "head_dim": HEAD_DIM, "groups": GROUPS, "state": STATE}


def rows(n: int, *rest: int) -> torch.Tensor:
    """Row i holds values i*1000 + j: a misplaced row shows which HF row it was."""
    cols = 1
    for r in rest:
        cols *= r
    return (torch.arange(n)[:, None] * 1000 + torch.arange(cols)[None, :]).float().reshape(n, *rest)


def in_proj() -> tuple[Blocks, dict[str, torch.Tensor]]:
    m = mamba_in_proj(megatron="decoder.layers.0.mixer.in_proj.weight", hf="in_proj.weight", **DIMS)
    return m, {"in_proj.weight": rows(2 * D + 2 * GN + HEADS, HIDDEN)}


def test_in_proj_shard_rows_are_z_x_b_c_dt_slices() -> None:
    """Written out independently: rank r's rows, as HF row indices, for tp=2."""
    m, hf = in_proj()
    layout = ParallelLayout(tp=2)
    z, x, b, c, dt = 0, D, 2 * D, 2 * D + GN, 2 * D + 2 * GN
    for r in range(2):
        want = [*range(z + r * 8, z + r * 8 + 8), *range(x + r * 8, x + r * 8 + 8), *range(b + r * 6, b + r * 6 + 6),
                *range(c + r * 6, c + r * 6 + 6), *range(dt + r * 4, dt + r * 4 + 4)]  # fmt: skip
        shard = m.to_shard(hf, layout, RankCoord(tp_rank=r))
        assert (shard[:, 0] / 1000).long().tolist() == want


def test_conv1d_shard_rows_are_x_b_c_slices() -> None:
    m = mamba_conv1d(megatron="decoder.layers.0.mixer.conv1d_bias", hf="conv1d.bias", **DIMS)
    hf = {"conv1d.bias": torch.arange(D + 2 * GN).float()}
    shard = m.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=1))
    assert shard.long().tolist() == [*range(8, 16), *range(D + 6, D + 12), *range(D + GN + 6, D + 2 * GN)]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_mamba_mappings_roundtrip_bitwise(tp: int) -> None:
    layout = ParallelLayout(tp=tp)
    conv_rows = D + 2 * GN
    cases = [
        in_proj(),
        (
            mamba_conv1d(megatron="l.conv1d_weight", hf="conv1d.weight", **DIMS),
            {"conv1d.weight": rows(conv_rows, 1, K)},
        ),
        (mamba_conv1d(megatron="l.conv1d_bias", hf="conv1d.bias", **DIMS), {"conv1d.bias": rows(conv_rows)}),
    ]
    for name, n in (("A_log", HEADS), ("D", HEADS), ("dt_bias", HEADS), ("norm.weight", D)):
        cases.append((Split(megatron=f"l.{name}", hf=name), {name: rows(n) - 0.5}))
    for mapping, hf in cases:
        assert roundtrip_findings(mapping, hf, layout) == [], mapping.megatron


def test_in_proj_rejects_groups_not_divisible_by_tp() -> None:
    m, hf = in_proj()
    with pytest.raises(MappingError, match="mamba_num_groups=4 is not divisible by tp=8"):
        m.to_shard(hf, ParallelLayout(tp=8), RankCoord(tp_rank=0))


def test_planted_dt_before_bc_is_caught_with_the_tensor_named() -> None:
    """A shard with each rank's dt rows before its B/C rows disagrees with ours, first at the row after z_r, x_r."""
    ours, hf = in_proj()
    layout = ParallelLayout(tp=2)
    findings = []
    for r in range(2):
        coord = RankCoord(tp_rank=r)
        z, x, b, c, dt = ours.to_shard(hf, layout, coord).split([D // 2, D // 2, GN // 2, GN // 2, HEADS // 2])
        buggy = torch.cat([z, x, dt, b, c])
        finding = compare_bits(ours.megatron, ours.to_shard(hf, layout, coord), buggy)
        findings += [finding] if finding is not None else []
    assert [f.tensor for f in findings] == ["decoder.layers.0.mixer.in_proj.weight"] * 2
    assert findings[0].detail["first_index"] == [D, 0]  # first row after z_r, x_r (D/2 rows each)


def nemotron_h_names() -> tuple[list[str], list[str]]:
    """Megatron names of the CPU (local) spec and HF names of a published-format NemotronH checkpoint (M*-ME)."""
    meg = ["embedding.word_embeddings.weight", "decoder.final_norm.weight", "output_layer.weight"]
    hf = ["backbone.embeddings.weight", "backbone.norm_f.weight", "lm_head.weight"]
    for i in (0, 3):
        meg += [f"decoder.layers.{i}.{p}" for p in ("norm.weight", "mixer.in_proj.weight", "mixer.conv1d_weight",
                "mixer.conv1d_bias", "mixer.A_log", "mixer.D", "mixer.dt_bias", "mixer.norm.weight",
                "mixer.out_proj.weight")]  # fmt: skip
        hf += [f"backbone.layers.{i}.{p}" for p in ("norm.weight", "mixer.in_proj.weight", "mixer.conv1d.weight",
               "mixer.conv1d.bias", "mixer.A_log", "mixer.D", "mixer.dt_bias", "mixer.norm.weight",
               "mixer.out_proj.weight")]  # fmt: skip
    meg += [f"decoder.layers.1.{p}" for p in ("input_layernorm.weight", "self_attention.linear_qkv.weight",
            "self_attention.linear_proj.weight")]  # fmt: skip
    hf += [f"backbone.layers.1.{p}" for p in ("norm.weight", "mixer.q_proj.weight", "mixer.k_proj.weight",
           "mixer.v_proj.weight", "mixer.o_proj.weight")]  # fmt: skip
    meg += [f"decoder.layers.2.{p}" for p in ("pre_mlp_layernorm.weight", "mlp.linear_fc1.weight",
            "mlp.linear_fc2.weight")]  # fmt: skip
    hf += [f"backbone.layers.2.{p}" for p in ("norm.weight", "mixer.up_proj.weight", "mixer.down_proj.weight")]
    meg += [f"decoder.layers.4.{p}" for p in ("pre_mlp_layernorm.weight", "mlp.router.weight", "mlp.router.expert_bias",
            "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight")]  # fmt: skip
    hf += [f"backbone.layers.4.{p}" for p in ("norm.weight", "mixer.gate.weight", "mixer.gate.e_score_correction_bias",
           "mixer.shared_experts.up_proj.weight", "mixer.shared_experts.down_proj.weight")]  # fmt: skip
    for e in range(4):
        meg += [f"decoder.layers.4.mlp.experts.local_experts.{e}.linear_fc{k}.weight" for k in (1, 2)]
        hf += [f"backbone.layers.4.mixer.experts.{e}.{p}_proj.weight" for p in ("up", "down")]
    return meg, hf


GEOMETRY = Geometry(hidden=32, num_heads=4, num_query_groups=2, head_dim=8, vocab=152, padded_vocab=152,
                    num_layers=5, ffn=64, layer_types=("mamba", "attention", "mlp", "mamba", "moe"),
                    num_experts=4, moe_ffn=16, mamba_heads=4, mamba_head_dim=8, mamba_groups=2,
                    mamba_state=8)  # fmt: skip


def test_registry_covers_nemotron_h_exactly_once() -> None:
    meg, hf = nemotron_h_names()
    registry = build_registry("NemotronHForCausalLM", GEOMETRY, meg, hf)
    assert set(registry.mappings) == set(meg) and registry.problems == ()
    assert isinstance(registry.get("decoder.layers.0.mixer.in_proj.weight"), Blocks)


def test_registry_nemotron_h_names_every_offender() -> None:
    """transformers' save name for the embedding and an unknown tensor are both named; strict raises."""
    meg, hf = nemotron_h_names()
    hf = [n.replace("backbone.embeddings.", "backbone.embedding.") for n in hf] + ["backbone.layers.0.mixer.extra"]
    with pytest.raises(CoverageError) as err:
        build_registry("NemotronHForCausalLM", GEOMETRY, meg + ["decoder.layers.0.mixer.unknown"], hf)
    message = str(err.value)
    for name in ("backbone.embedding.weight", "backbone.embeddings.weight", "backbone.layers.0.mixer.extra",
                 "decoder.layers.0.mixer.unknown"):  # fmt: skip
        assert name in message


def test_geometry_reads_nemotron_h_config() -> None:
    from convcheck.fixtures.build import build_fixture
    from convcheck.hf.checkpoint import open_checkpoint

    config = open_checkpoint(build_fixture("tiny:nemotron-h")).config
    assert Geometry.from_hf_config(config, padded_vocab=152) == GEOMETRY
