"""Gemma 4 text, the MoE variant (26B-A4B, enable_moe_block), through the real bridge on CPU: `tiny:gemma4-moe` (sliding
/ full layers of different head widths and KV heads, keys as values on the full layers, dual RoPE with the
proportional partial one, 8 experts top-2 beside a dense MLP, the router's scale and per-expert scale, the extra
norms, final softcap, tied embeddings), built from the bridge's TE MoE spec (modeling_gemma4.py:1517) on convcheck's TE
stand-in, its explicit mappings (models/gemma4_mappings.py), the MoE rows of the config table (models/gemma4.py).

Known megatron-bridge 0.6.2 bug it meets, named and still failing:
- te-post-layernorm-default-eps: linear_proj is TERowParallelLinearLayerNorm, whose post-attention norm takes TE's
  default epsilon 1e-5 for HF's 1e-6 (te_layers.py:47): the logits differ (2.7e-4); with the epsilon fixed, 2.2e-8.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from convcheck.compare.bits import bytes_equal, compare_bits
from convcheck.errors import BadInput
from convcheck.fixtures.from_config import shrink_file
from convcheck.fixtures.values import distinct_values
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout, RankCoord
from convcheck.mappings import Gated, Replicated
from convcheck.mappings.fused_experts import FusedSlice
from convcheck.models import TABLES, UPSTREAM_BUG, tag_upstream_bugs
from convcheck.models.config_rules import IGNORED, Coverage
from convcheck.models.gemma4 import TINY_GEMMA4
from convcheck.models.gemma4_moe import TINY_GEMMA4_MOE
from convcheck.models.mapping_registry import build_registry
from convcheck.oracles.config import check_rule, flatten, uncovered
from convcheck.verdict import Finding, OracleVerdict
from tests.support.helpers import matrix_run
from tests.test_verify_matrix import assert_matches_golden

DATA = Path(__file__).parent / "data"
ORACLES = ("coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping")
EPS_BUG = "te-post-layernorm-default-eps"
EXPERTS = 8
LAYER = (
    "self_attention.linear_qkv.layer_norm_weight",
    "self_attention.linear_qkv.weight",
    "self_attention.q_layernorm.weight",
    "self_attention.k_layernorm.weight",
    "self_attention.linear_proj.weight",
    "self_attention.linear_proj.post_layernorm.weight",
    "pre_shared_expert_layernorm.weight",
    "pre_mlp_layernorm.weight",
    "post_ffn_layernorm.weight",
    "layer_scalar",
    "mlp.router.weight",
    "mlp.router.scale",
    "mlp.router.per_expert_scale",
    "mlp.shared_experts.linear_fc1.weight",
    "mlp.shared_experts.linear_fc2.weight",
    "mlp.post_shared_expert_layernorm.weight",
    "mlp.post_moe_layernorm.weight",
    *(f"mlp.experts.linear_fc{fc}.weight{e}" for fc in (1, 2) for e in range(EXPERTS)),
)
"""One decoder layer's parameters in the bridge's Gemma 4 MoE layer (TE grouped experts, modeling_gemma4.py:1276+)."""
HF_LAYER = (
    "input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
    "post_feedforward_layernorm.weight", "post_feedforward_layernorm_1.weight", "post_feedforward_layernorm_2.weight",
    "pre_feedforward_layernorm_2.weight", "layer_scalar", "router.scale", "router.per_expert_scale",
    "router.proj.weight", "experts.gate_up_proj", "experts.down_proj", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "self_attn.o_proj.weight",
)  # fmt: skip


def _geometry() -> Geometry:
    return Geometry.from_hf_config({**TINY_GEMMA4_MOE.config, "model_type": "gemma4_text"})


def _registry() -> Any:
    megatron = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight"]
    megatron += [f"decoder.layers.{i}.{p}" for i in range(6) for p in LAYER]
    hf = ["model.embed_tokens.weight", "model.norm.weight"]
    hf += [f"model.layers.{i}.{p}" for i in range(6) for p in HF_LAYER]
    hf += [f"model.layers.{i}.self_attn.v_proj.weight" for i in range(6) if i % 3 != 2]  # full layers: keys as values
    return build_registry("Gemma4ForCausalLM", _geometry(), megatron, hf, tied=True, strict=True)


def test_the_explicit_mappings_cover_every_moe_parameter_once_with_each_norm_to_its_own() -> None:
    registry = _registry()
    assert len(registry.mappings) == 2 + 6 * len(LAYER) and registry.problems == ()
    norms = {
        "self_attention.linear_qkv.layer_norm_weight": "input_layernorm",
        "self_attention.linear_proj.post_layernorm.weight": "post_attention_layernorm",
        "pre_shared_expert_layernorm.weight": "pre_feedforward_layernorm",
        "pre_mlp_layernorm.weight": "pre_feedforward_layernorm_2",
        "mlp.post_shared_expert_layernorm.weight": "post_feedforward_layernorm_1",
        "mlp.post_moe_layernorm.weight": "post_feedforward_layernorm_2",
        "post_ffn_layernorm.weight": "post_feedforward_layernorm",
    }
    for megatron, hf in norms.items():
        mapping = registry.get(f"decoder.layers.3.{megatron}")
        assert isinstance(mapping, Replicated) and mapping.hf == f"model.layers.3.{hf}.weight", megatron
    router = {p: registry.get(f"decoder.layers.1.mlp.router.{p}") for p in ("weight", "scale", "per_expert_scale")}
    assert {p: (type(m), m.hf) for p, m in router.items()} == {
        "weight": (Replicated, "model.layers.1.router.proj.weight"),
        "scale": (Replicated, "model.layers.1.router.scale"),
        "per_expert_scale": (Replicated, "model.layers.1.router.per_expert_scale"),
    }
    shared = registry.get("decoder.layers.2.mlp.shared_experts.linear_fc1.weight")
    assert isinstance(shared, Gated) and (shared.gate, shared.up) == (
        "model.layers.2.mlp.gate_proj.weight", "model.layers.2.mlp.up_proj.weight")  # fmt: skip
    qkv = registry.get("decoder.layers.2.self_attention.linear_qkv.weight")
    assert (qkv.num_query_groups, qkv.head_dim, qkv.v) == (2, 16, None)  # full: 2 KV heads of 16, keys as values
    assert registry.get("decoder.layers.1.self_attention.linear_qkv.weight").num_query_groups == 4


def test_bridge_0_5_s_buffer_of_the_dense_mlp_s_input_norm_maps_to_pre_feedforward_layernorm() -> None:
    """megatron-bridge 0.5.x holds pre_feedforward_layernorm in the layer's buffer `pffl_weight` where 0.6.2 builds
    pre_shared_expert_layernorm (gemma4_provider.py:207 there): both names map to it, whole."""
    layer = [p if p != "pre_shared_expert_layernorm.weight" else "pffl_weight" for p in LAYER]
    megatron = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight"]
    megatron += [f"decoder.layers.{i}.{p}" for i in range(6) for p in layer]
    hf = ["model.embed_tokens.weight", "model.norm.weight"]
    hf += [f"model.layers.{i}.{p}" for i in range(6) for p in HF_LAYER]
    hf += [f"model.layers.{i}.self_attn.v_proj.weight" for i in range(6) if i % 3 != 2]
    registry = build_registry("Gemma4ForCausalLM", _geometry(), megatron, hf, tied=True, strict=True)
    assert registry.problems == () and len(registry.mappings) == 2 + 6 * len(layer)
    mapping = registry.get("decoder.layers.4.pffl_weight")
    assert isinstance(mapping, Replicated) and mapping.hf == "model.layers.4.pre_feedforward_layernorm.weight"


def _fused(layer: int = 0) -> dict[str, torch.Tensor]:
    """Layer `layer`'s fused experts and dense MLP norms with distinct values, as save_pretrained writes them."""
    f, h = TINY_GEMMA4_MOE.config["moe_intermediate_size"], TINY_GEMMA4_MOE.config["hidden_size"]
    prefix = f"model.layers.{layer}."
    shapes = {"experts.gate_up_proj": (EXPERTS, 2 * f, h), "experts.down_proj": (EXPERTS, h, f),
              "pre_feedforward_layernorm.weight": (h,), "pre_feedforward_layernorm_2.weight": (h,)}  # fmt: skip
    return {prefix + n: distinct_values(s, prefix + n, 1234, torch.bfloat16) for n, s in shapes.items()}


def test_an_expert_slice_goes_to_its_own_expert_and_a_neighbour_s_slice_is_named_at_its_first_element() -> None:
    """EP2 x ETP2: rank (ep 1, etp 1) holds expert 5's up rows 4:8 and gate rows 4:8 and down columns 4:8; expert 4's
    slice loaded in its place (a bridge that numbers experts from the wrong base) differs from element [0, 0]."""
    registry, hf = _registry(), _fused()
    layout, coord = ParallelLayout(tp=2, ep=2, etp=2), RankCoord(tp_rank=1, ep_rank=1, etp_rank=1)
    fc1 = registry.get("decoder.layers.0.mlp.experts.linear_fc1.weight5")
    fc2 = registry.get("decoder.layers.0.mlp.experts.linear_fc2.weight5")
    assert isinstance(fc1, FusedSlice) and isinstance(fc2, FusedSlice)
    gate_up, down = hf["model.layers.0.experts.gate_up_proj"], hf["model.layers.0.experts.down_proj"]
    shard = fc1.to_shard(hf, layout, coord)
    assert bytes_equal(shard, torch.cat([gate_up[5, 4:8], gate_up[5, 12:16]]))
    assert bytes_equal(fc2.to_shard(hf, layout, coord), down[5, :, 4:8])
    wrong = torch.cat([gate_up[4, 4:8], gate_up[4, 12:16]])
    finding = compare_bits(fc1.megatron, shard, wrong)
    assert finding is not None and finding.tensor == "decoder.layers.0.mlp.experts.linear_fc1.weight5"
    assert "first at index [0, 0]" in finding.message


def test_the_experts_input_norm_traded_with_the_dense_mlp_s_is_named_at_its_first_element() -> None:
    """pre_mlp_layernorm is the experts' input norm (pre_feedforward_layernorm_2); the dense variant's target, the
    dense MLP's input norm, loaded in its place differs from element [0]."""
    mapping, hf = _registry().get("decoder.layers.0.pre_mlp_layernorm.weight"), _fused()
    shard = mapping.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=1))
    assert bytes_equal(shard, hf["model.layers.0.pre_feedforward_layernorm_2.weight"])
    finding = compare_bits(mapping.megatron, shard, hf["model.layers.0.pre_feedforward_layernorm.weight"])
    assert finding is not None and "first at index [0]" in finding.message


def _provider(spec: Any = TINY_GEMMA4_MOE, **overrides: Any) -> tuple[Any, dict[str, Any]]:
    """(the real bridge's provider, the flattened HF view) of `spec`'s config."""
    import transformers

    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge import AutoBridge

    cls = transformers.Gemma4TextConfig
    hf = cls(**{**spec.config, **overrides})
    hf.architectures = ["Gemma4ForCausalLM"]
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    return provider, {**flatten(cls().to_dict()), **flatten(hf.to_dict())}


def _failing(provider: Any, view: dict[str, Any]) -> dict[str, Finding]:
    """Label -> finding of every provider-side rule (the `model.*` rules need a built model) that fails."""

    def get(name: str) -> Any:
        if not hasattr(provider, name):
            raise AttributeError(name)
        return getattr(provider, name)

    rules = [r for r in TABLES["gemma4_text"] if not r.megatron.startswith("model.")]
    return {f.tensor: f for f in (check_rule(r, view, get) for r in rules) if f is not None}


def test_the_real_providers_of_both_variants_satisfy_every_rule_and_every_field_is_named() -> None:
    import transformers

    assert _failing(*_provider()) == {} and _failing(*_provider(TINY_GEMMA4)) == {}
    cls, rules = transformers.Gemma4TextConfig, TABLES["gemma4_text"]
    named = {f.split(".")[0] for rule in rules for f in (*rule.hf, *rule.also)}
    assert sorted(set(cls.__annotations__) - named - set(IGNORED)) == []
    checked = {}
    for spec in (TINY_GEMMA4, TINY_GEMMA4_MOE):
        source, defaults = flatten(cls(**spec.config).to_dict()), flatten(cls().to_dict())
        assert uncovered(source, defaults, Coverage(rules=rules)) == []
        checked[spec.name] = {r.label for r in rules if r.when is None or r.when({**defaults, **source})}
    only_dense, only_moe = checked["gemma4"] - checked["gemma4-moe"], checked["gemma4-moe"] - checked["gemma4"]
    assert "global_head_dim -> global_kv_channels" in only_dense and "global_head_dim -> global_head_dim" in only_moe
    assert "num_experts -> num_moe_experts" in only_moe and "num_experts -> num_layers" in only_dense


def test_a_wrong_pattern_partial_rope_and_expert_count_on_the_real_moe_provider_are_named_by_field() -> None:
    """Planted on the real Gemma4Bridge's MoE provider: the (5, 1) default pattern for HF's (2, 1), the full layers'
    partial factor 0.5 for 0.25, 4 experts for 8; and a config the MoE provider cannot build (KV sharing, per-layer
    inputs) is named, not passed, as are separate keys and values on the full layers with num_global_key_value_heads
    set (HF then reads num_key_value_heads there, the bridge the global count)."""
    provider, view = _provider()
    provider.interleaved_attn_pattern, provider.global_rotary_percent, provider.num_moe_experts = (5, 1), 0.5, 4
    found = _failing(provider, view)
    assert sorted(found) == [
        "enable_moe_block -> num_moe_experts",
        "layer_types -> interleaved_attn_pattern",
        "num_experts -> num_moe_experts",
        "rope_parameters.full_attention.partial_rotary_factor -> global_rotary_percent",
    ]
    assert found["layer_types -> interleaved_attn_pattern"].detail["expected"] == "[1, 1, 0, 1, 1, 0]"
    assert found["layer_types -> interleaved_attn_pattern"].detail["actual"] == "[1, 1, 1, 1, 1, 0]"
    sharing, view = _provider(num_kv_shared_layers=2, hidden_size_per_layer_input=4)
    assert sorted(_failing(sharing, view)) == ["hidden_size_per_layer_input -> num_layers",
                                               "num_kv_shared_layers -> num_layers"]  # fmt: skip
    separate, view = _provider(attention_k_eq_v=False)  # HF's full layers then take num_key_value_heads (4), not 2
    found = _failing(separate, view)
    heads = found.pop("num_global_key_value_heads -> num_global_key_value_heads")
    assert found == {} and (heads.detail["expected"], heads.detail["actual"]) == ("4", "2")
    dense, view = _provider(TINY_GEMMA4_MOE, enable_moe_block=False)
    assert "enable_moe_block -> num_moe_experts" not in _failing(dense, view)  # the dense provider, as asked


def test_the_post_norm_epsilon_bug_tags_the_moe_variant_s_logits_only() -> None:
    logits = OracleVerdict(name="logits", checked=1, findings=(Finding(tensor="logits", kind="logits-differ",
                                                                       message="m"),))  # fmt: skip
    moe = {"architectures": ["Gemma4ForCausalLM"], "enable_moe_block": True}
    (tagged,), lines = tag_upstream_bugs("Gemma4ForCausalLM", "0.6.2", [logits], config=moe)
    assert tagged.findings[0].detail[UPSTREAM_BUG] == EPS_BUG and len(lines) == 1
    (dense,), lines = tag_upstream_bugs(
        "Gemma4ForCausalLM", "0.6.2", [logits], config={**moe, "enable_moe_block": False}
    )
    assert UPSTREAM_BUG not in dense.findings[0].detail and lines == []


def test_the_moe_provider_s_post_attention_norm_is_still_the_te_layer_with_the_default_epsilon() -> None:
    import importlib.util

    bridge = Path(importlib.util.find_spec("megatron.bridge").origin).parent / "models"  # type: ignore[arg-type]
    modeling = (bridge / "gemma" / "modeling_gemma4.py").read_text().splitlines()
    assert "attn_spec.submodules.linear_proj = TERowParallelLinearLayerNorm" in modeling[1529]
    te_layers = (bridge / "common" / "te_layers.py").read_text().splitlines()
    assert "TENorm(" in te_layers[46] and "eps" not in te_layers[46]


@pytest.mark.ranks
def test_gemma4_moe_tp2ep2_fails_only_on_the_post_norm_epsilon(shared_root: Path) -> None:
    """The gate case: every weight oracle, config and mapping pass at TP2 x EP2 (the experts split over EP, the dense
    MLP over TP); logits name only te-post-layernorm-default-eps, greedy 32/32."""
    layout = ("--tp", "2", "--ep", "2", "--spec", "te", "--experts", "auto")
    res, folder = matrix_run(shared_root, "gemma4-moe", layout)
    assert_matches_golden("gemma4-moe", layout, folder / "manifest.json")
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {**dict.fromkeys(ORACLES, "pass"), "logits": "fail"}
    assert [(f["tensor"], f["kind"], f["detail"][UPSTREAM_BUG]) for f in res.findings("logits")] == [
        ("logits", "logits-differ", EPS_BUG)
    ]
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert [t["verdict"] for t in oracles["mapping"]["tensors"]].count("pass") == 200  # every Megatron parameter
    assert oracles["logits"]["metrics"]["greedy_match"] == "32/32"


def test_the_26b_a4b_config_shrinks_with_its_pattern_heads_routing_and_no_per_layer_inputs(tmp_path: Path) -> None:
    shrunk = shrink_file(DATA / "gemma-4-26b-a4b.text-config.json")
    c = shrunk.spec.config
    assert c["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 2
    assert (c["enable_moe_block"], c["num_experts"], c["top_k_experts"], c["moe_intermediate_size"]) == (True, 8, 4, 8)
    assert (c["num_key_value_heads"], c["num_global_key_value_heads"], c["head_dim"], c["global_head_dim"]) == (
        2, 1, 12, 24)  # fmt: skip
    assert (c["attention_k_eq_v"], c["hidden_size_per_layer_input"], c["num_kv_shared_layers"]) == (True, 0, 0)
    assert (c["intermediate_size"], c["vocab_size"], c["final_logit_softcapping"]) == (64, 128, 30.0)
    assert "num_experts 128 top-8 -> 8 top-4" in shrunk.notes
    assert shrunk.spec.near_one_tensors == ("router.scale", "router.per_expert_scale")
    broken = tmp_path / "config.json"
    broken.write_text(json.dumps({**json.loads((DATA / "gemma-4-26b-a4b.text-config.json").read_text()),
                                  "num_experts": None}))  # fmt: skip
    with pytest.raises(BadInput, match="enable_moe_block without num_experts and top_k_experts"):
        shrink_file(broken)
