"""MiniMax-M2 through the real bridge on CPU: `tiny:minimax-m2` (the published structure: every layer MoE, sigmoid
routing with an fp32 expert bias, q/k norms over all heads at once, partial RoPE), built in the bridge's own TE layout
(convcheck.models.te_only), its explicit mappings (models/minimax_m2_mappings.py), config table (models/minimax_m2.py)
and `--from-config` rule. Its gate case (TP2xEP2) passes every oracle (tests/test_verify_matrix.py); its mutants run in
tests/test_catalog_kills.py. The published config.json, shrunk, meets transformers-minimax-m2-rotary-dim-ignored:
transformers 5.12.1 reads no rotary_dim (modeling_minimax_m2.py:187-189)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from convcheck.errors import BadInput
from convcheck.fixtures.from_config import class_fields, read_config, shrink_file
from convcheck.fixtures.shrink import shrink_config
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mappings import RankCoord, Replicated, Split, roundtrip_findings
from convcheck.models.mapping_registry import build_registry
from convcheck.models.minimax_m2 import MINIMAX_M2_TABLE, TINY_MINIMAX_M2
from tests.support.helpers import run_cli

DATA = Path(__file__).parent / "data"
LAYER = (
    "self_attention.linear_qkv.layer_norm_weight",
    "self_attention.linear_qkv.weight",
    "self_attention.q_layernorm.weight",
    "self_attention.k_layernorm.weight",
    "self_attention.linear_proj.weight",
    "pre_mlp_layernorm.weight",
    "mlp.router.weight",
    "mlp.router.expert_bias",
    *(f"mlp.experts.linear_fc{fc}.weight{e}" for fc in (1, 2) for e in range(8)),
)
"""One decoder layer's parameters in the bridge's MiniMax-M2 spec (TE MoE spec, grouped experts)."""


def _names() -> list[str]:
    names = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight"]
    return names + [f"decoder.layers.{i}.{p}" for i in range(2) for p in LAYER]


def _hf_names() -> list[str]:
    attention = [f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]
    moe = ["block_sparse_moe.gate.weight", "block_sparse_moe.e_score_correction_bias"]
    moe += [f"block_sparse_moe.experts.{e}.{w}.weight" for e in range(8) for w in ("w1", "w2", "w3")]
    per_layer = [*attention, "input_layernorm.weight", "post_attention_layernorm.weight", *moe]
    names = [f"model.layers.{i}.{p}" for i in range(2) for p in per_layer]
    return ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", *names]


def _registry():  # type: ignore[no-untyped-def]
    geometry = Geometry.from_hf_config({**TINY_MINIMAX_M2.config, "model_type": "minimax_m2"})
    return build_registry("MiniMaxM2ForCausalLM", geometry, _names(), _hf_names())


def test_the_explicit_mappings_cover_every_parameter_once() -> None:
    registry = _registry()
    assert len(_names()) == 51 and set(registry.mappings) == set(_names()) and registry.problems == ()
    bias = registry.get("decoder.layers.1.mlp.router.expert_bias")
    assert isinstance(bias, Replicated) and bias.hf == "model.layers.1.block_sparse_moe.e_score_correction_bias"
    fc1 = registry.get("decoder.layers.0.mlp.experts.linear_fc1.weight3")
    assert (fc1.gate, fc1.up) == ("model.layers.0.block_sparse_moe.experts.3.w1.weight",
                                  "model.layers.0.block_sparse_moe.experts.3.w3.weight")  # fmt: skip
    fc2 = registry.get("decoder.layers.0.mlp.experts.linear_fc2.weight7")
    assert fc2.hf == "model.layers.0.block_sparse_moe.experts.7.w2.weight"


@pytest.mark.parametrize("norm", ["q", "k"])
def test_a_full_width_qk_norm_gives_each_tp_rank_the_rows_of_its_own_heads(norm: str) -> None:
    """q_norm [heads x head_dim] and k_norm [kv_heads x head_dim]: one RMSNorm over every head, whose rows follow
    linear_qkv's heads over TP (rank r: heads r * n / tp ...), split along dim 0 and gathered back bitwise."""
    mapping = _registry().get(f"decoder.layers.0.self_attention.{norm}_layernorm.weight")
    assert isinstance(mapping, Split) and mapping.dim == 0
    width = {"q": 32, "k": 16}[norm]
    weight = torch.arange(width, dtype=torch.float32).to(torch.bfloat16)
    hf = {mapping.hf: weight}
    layout = ParallelLayout.parse("tp2")
    assert torch.equal(mapping.to_shard(hf, layout, RankCoord(tp_rank=1)), weight[width // 2 :])
    assert roundtrip_findings(mapping, hf, layout) == []


def _rule(megatron: str):  # type: ignore[no-untyped-def]
    return next(r for r in MINIMAX_M2_TABLE if r.megatron == megatron)


def test_the_config_table_reads_partial_rope_from_what_transformers_rotates() -> None:
    by_hf, by_dim = (r for r in MINIMAX_M2_TABLE if r.megatron == "rotary_percent")
    both = {"rope_parameters.partial_rotary_factor": 0.5, "rotary_dim": 4, "head_dim": 8}
    assert by_hf.expect(both, {}.get) == by_dim.expect(both, {}.get) == 0.5
    published = {"rotary_dim": 64, "head_dim": 128}
    assert (by_hf.expect(published, {}.get), by_dim.expect(published, {}.get)) == (1.0, 0.5)  # HF reads no rotary_dim
    assert _rule("moe_router_score_function").expect({}, {}.get) == "sigmoid"
    assert _rule("moe_router_enable_expert_bias").expect({}, {}.get) is True


def test_the_published_config_shrinks_with_routing_norms_and_rotary_share_kept() -> None:
    shrunk = shrink_file(DATA / "minimax-m2.config.json")
    c = shrunk.spec.config
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["hidden_size"]) == (12, 2, 8, 32)
    assert (c["num_local_experts"], c["num_experts_per_tok"], c["intermediate_size"]) == (8, 4, 20)
    assert (c["num_hidden_layers"], c["rotary_dim"]) == (2, 4)  # 64 of 128 -> 4 of 8
    assert shrunk.spec.fp32_tensors == ("e_score_correction_bias",)
    assert shrunk.quantization_config is not None and shrunk.quantization_config["weight_block_size"] == [128, 128]
    notes = "\n".join(shrunk.notes)
    assert "num_local_experts 256 -> 8" in notes and "rotary_dim 64 -> 4" in notes
    assert "dropped use_mtp=True (MiniMax's MTP modules: transformers 5.12.1 builds none and the bridge maps none" in (
        notes
    )
    for field in ("attn_type_list", "qk_norm_type", "scoring_func", "use_routing_bias", "use_qk_norm", "auto_map"):
        assert field not in c and f"dropped {field}" in notes


def test_a_minimax_knob_transformers_cannot_build_is_refused_in_one_line() -> None:
    base = read_config(DATA / "minimax-m2.config.json")
    fields = class_fields("MiniMaxM2Config")
    with pytest.raises(BadInput, match="attn_type_list names lightning-attention layers"):
        shrink_config({**base, "attn_type_list": [0, 1] * 31}, fields, name="x")
    with pytest.raises(BadInput, match="scoring_func='softmax' cannot be kept: MiniMaxM2Config"):
        shrink_config({**base, "scoring_func": "softmax"}, fields, name="x")
    with pytest.raises(BadInput, match="shared_intermediate_size=512 cannot be kept"):
        shrink_config({**base, "shared_intermediate_size": 512}, fields, name="x")


@pytest.mark.ranks
def test_the_published_config_shrunk_names_the_rotary_dim_transformers_does_not_read(tmp_path: Path) -> None:
    """rotary_dim 64 of head_dim 128 with no partial_rotary_factor: transformers rotates every channel, the bridge
    half (config names it; the logits, not run here, differ by 4.4e-3 at TP2xEP2: docs/compat.md)."""
    res = run_cli("verify", "--model", f"config:{DATA / 'minimax-m2.config.json'}", "--oracle", "config",
                  "--table", "none", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    found = {f["tensor"]: (f["kind"], f["detail"].get("upstream_bug")) for f in res.findings("config")}
    bug = "transformers-minimax-m2-rotary-dim-ignored"
    assert found == {
        "rope_parameters.partial_rotary_factor -> rotary_percent": ("mismatch", bug),
        "rope_parameters.partial_rotary_factor (megatron_to_hf_config)": ("roundtrip-mismatch", bug),
    }  # the rotary_dim rule holds: Megatron rotates rotary_dim / head_dim, as MiniMax's code
