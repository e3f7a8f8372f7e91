"""GPT-OSS without ranks: the interleaved fused-expert mappings on predictable tensors, the config table's window
rules, and shim 23's still-needed test."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from convcheck import compat
from convcheck.fixtures.from_config import read_config
from convcheck.layout import ParallelLayout, RankCoord
from convcheck.mappings import Gated, Split
from convcheck.mappings.interleaved_experts import ExpertBias, InterleavedSlice
from convcheck.models import FIXTURES
from convcheck.models.gpt_oss_config import GPT_OSS_TABLE, hf_window_layers, hf_window_size, megatron_window_layers
from convcheck.models.gpt_oss_mappings import expert_slice
from convcheck.oracles.config import flatten
from tests.support.release_targets import on_current_pins, skip_unless

torch = pytest.importorskip("torch")

E, H, F = 4, 3, 2
"""Experts, hidden, intermediate of the hand-made tensors."""


def _gate_up(expert: int, layout: ParallelLayout) -> InterleavedSlice:
    inner = Gated(megatron=f"fc1.weight{expert}", axis="etp", expert=expert, num_experts=E, gate="g", up="u")
    return InterleavedSlice(inner=inner, fused="gate_up_proj", projection="gate_up_proj")


def test_gate_up_rows_are_the_even_then_odd_columns_of_expert_e() -> None:
    fused = torch.arange(E * H * 2 * F, dtype=torch.float32).reshape(E, H, 2 * F)  # [E, hidden, 2F]
    layout = ParallelLayout(ep=2)
    fc1 = _gate_up(3, layout)
    shard = fc1.to_shard({"gate_up_proj": fused}, layout, RankCoord(ep_rank=1))
    assert torch.equal(shard, torch.cat([fused[3][:, 0::2].t(), fused[3][:, 1::2].t()]))
    shards = {c: fc1.to_shard({"gate_up_proj": fused}, layout, c) for c in fc1.coords(layout)}
    assert [(n, t.tolist()) for n, t in fc1.from_shards(shards, layout)] == [("gate_up_proj[3]", fused[3].tolist())]


def test_gate_up_under_expert_tp_gives_each_rank_its_gate_and_up_rows() -> None:
    """What megatron-core would hold at ETP2 ([gate_r; up_r] per rank), though 0.19.2 refuses MoE biases there."""
    fused = torch.arange(E * H * 4, dtype=torch.float32).reshape(E, H, 4)  # F = 2: gate cols 0, 2; up cols 1, 3
    layout = ParallelLayout(tp=2, etp=2)
    fc1 = _gate_up(0, layout)
    shard = fc1.to_shard({"gate_up_proj": fused}, layout, RankCoord(etp_rank=1))
    assert torch.equal(shard, torch.stack([fused[0][:, 2], fused[0][:, 3]]))


def test_bias_alternates_like_the_weight_and_down_proj_is_transposed() -> None:
    bias = torch.arange(E * 2 * F, dtype=torch.float32).reshape(E, 2 * F)
    inner = Gated(megatron="fc1.bias1", axis="etp", expert=1, num_experts=E, gate="g", up="u")
    b1 = InterleavedSlice(inner=inner, fused="gate_up_proj_bias", projection="gate_up_proj_bias")
    layout = ParallelLayout()
    assert b1.to_shard({"gate_up_proj_bias": bias}, layout, RankCoord()).tolist() == [4.0, 6.0, 5.0, 7.0]
    down = torch.arange(E * F * H, dtype=torch.float32).reshape(E, F, H)  # [E, F, hidden]
    fc2 = InterleavedSlice(
        inner=Split(megatron="fc2.weight2", axis="etp", dim=1, expert=2, num_experts=E, hf="d"),
        fused="down_proj",
        projection="down_proj",
    )
    assert torch.equal(fc2.to_shard({"down_proj": down}, layout, RankCoord()), down[2].t())
    shards = {c: fc2.to_shard({"down_proj": down}, layout, c) for c in fc2.coords(layout)}
    assert [(n, t.tolist()) for n, t in fc2.from_shards(shards, layout)] == [("down_proj[2]", down[2].tolist())]
    fc2_bias = InterleavedSlice(
        inner=ExpertBias(megatron="fc2.bias3", axis="etp", expert=3, num_experts=E, hf="b"),
        fused="down_proj_bias",
        projection="down_proj_bias",
    )
    ep2 = ParallelLayout(ep=2)
    assert fc2_bias.coords(ep2) == [RankCoord(ep_rank=1)]
    with pytest.raises(Exception, match="lives on ep_rank 1"):
        fc2_bias.to_shard({"down_proj_bias": torch.zeros(E, H)}, ep2, RankCoord(ep_rank=0))


def test_registry_maps_every_expert_parameter_spelling_once() -> None:
    """Local (SequentialMLP) and TE grouped names of one layer; every fused tensor produced once."""
    import re

    from convcheck.hf.geometry import Geometry
    from convcheck.models.gpt_oss_mappings import EXPERT
    from convcheck.models.shared_mappings import LAYER_PREFIX

    geometry = Geometry(hidden=H, num_heads=4, vocab=8, num_experts=E, ffn=F)
    for name, kind in (
        ("decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.bias", Gated),
        ("decoder.layers.1.mlp.experts.linear_fc2.weight3", Split),
        ("decoder.layers.1.mlp.experts.linear_fc2.bias0", ExpertBias),
    ):
        mapping = expert_slice(re.fullmatch(LAYER_PREFIX + EXPERT, name), geometry)
        assert isinstance(mapping.inner, kind)
    assert mapping.fused == "model.layers.1.mlp.experts.down_proj_bias" and mapping.expert == 0


def test_window_rules_read_layer_types_and_megatron_skip_freq() -> None:
    config = FIXTURES["gpt-oss"].config
    view = {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": config["sliding_window"]}
    assert hf_window_layers(view, None) == [1, 0, 1, 0]
    assert hf_window_size(view, None) == (3, 0)
    fields = {"num_layers": 4, "window_size": (3, 0)}
    assert megatron_window_layers(2, fields.get) == [1, 0, 1, 0]  # utils.py:504, layer numbers from 1
    assert megatron_window_layers(None, fields.get) == [1, 1, 1, 1]


def test_yarn_rules_read_the_published_rope_scaling_as_transformers_4_spells_it() -> None:
    """The published gpt-oss-20b config.json keeps its yarn settings in rope_scaling (transformers 4.57, bridge 0.3.x's
    pin, reads them there); transformers 5 spells them rope_parameters: the rules read either."""
    published = flatten(read_config(Path(__file__).parent / "data" / "gpt-oss-20b.config.json"))
    assert not any(k.startswith("rope_parameters.") for k in published)
    rules = {r.megatron: r for r in GPT_OSS_TABLE}
    expect = {name: rules[name].expect(published, None) for name in (
        "position_embedding_type", "yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings",
        "yarn_beta_fast", "yarn_beta_slow", "yarn_correction_range_round_to_int")}  # fmt: skip
    assert expect == {
        "position_embedding_type": "yarn",
        "yarn_rotary_scaling_factor": 32.0,
        "yarn_original_max_position_embeddings": 4096,
        "yarn_beta_fast": 32.0,
        "yarn_beta_slow": 1.0,
        "yarn_correction_range_round_to_int": False,
    }
    spelled_5 = {f"rope_parameters.{k.removeprefix('rope_scaling.')}": v for k, v in published.items()
                 if k.startswith("rope_scaling.")}  # fmt: skip
    assert {name: rules[name].expect(spelled_5, None) for name in expect} == expect


def test_shim23_still_needed_sinks_allocated_on_cuda() -> None:
    """Fails when DotProductAttention stops allocating softmax_offset on torch.cuda.current_device() (then delete
    shim 23)."""
    compat.install_import_shims()
    from megatron.core.transformer import dot_product_attention

    source = inspect.getsource(compat.upstream(dot_product_attention.DotProductAttention.__init__))
    skip_unless('"learnable"' in source, "softmax_type learnable")
    learnable = source[source.index('softmax_type == "learnable"') :]
    assert "device=torch.cuda.current_device()" in learnable.split("else:")[0]
    if on_current_pins():
        lines = inspect.getsourcelines(compat.upstream(dot_product_attention.DotProductAttention.__init__))
        first = lines[1]
        numbered = {first + i: text for i, text in enumerate(lines[0])}
        assert "device=torch.cuda.current_device()" in numbered[132]


def test_bridge_mxfp4_dequantization_runs_on_cpu() -> None:
    """The bridge's dequantize_mxfp4 (the import path of `*_blocks` / `*_scales`) is plain torch: it runs on the CPU.
    Byte 0x21 holds e2m1 codes 1 (0.5, low nibble first) and 2 (1.0); scale 128 doubles them."""
    compat.install_import_shims()
    from megatron.bridge.models.conversion.quantization_utils import dequantize_mxfp4

    blocks = torch.full((2, 3, 1, 16), 0x21, dtype=torch.uint8)  # [E, rows, groups, 16 bytes = 32 values]
    scales = torch.tensor([[[127], [128], [126]]] * 2, dtype=torch.uint8)
    out = dequantize_mxfp4(blocks, scales)
    assert out.shape == (2, 3, 32) and out.device.type == "cpu"
    assert out[0, :, :2].tolist() == [[0.5, 1.0], [1.0, 2.0], [0.25, 0.5]]
