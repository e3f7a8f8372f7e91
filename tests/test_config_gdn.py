"""The config oracle's tables for Qwen3-Next / Qwen3.5 / Qwen3.5-MoE (issue #29), no ranks: every config-class field is
named, the real bridges' providers satisfy every rule for the tiny fixtures, a planted provider field is named, and
the real megatron_to_hf_config's losses are named as the known bridge gap."""

from __future__ import annotations

from typing import Any

import pytest

from convcheck.models import TABLES
from convcheck.models.config_rules import IGNORED, Coverage
from convcheck.models.qwen_next import TINY_QWEN3_NEXT, TINY_QWEN35, TINY_QWEN35_MOE
from convcheck.models.qwen_next_config import GDN_CONFIG_EXPORT_LOSES_SCHEDULE
from convcheck.oracles.config import check_rule, flatten, uncovered

CASES = {
    "qwen3_next": (TINY_QWEN3_NEXT, "Qwen3NextForCausalLM"),
    "qwen3_5_text": (TINY_QWEN35, "Qwen3_5ForCausalLM"),
    "qwen3_5_moe_text": (TINY_QWEN35_MOE, "Qwen3_5MoeForCausalLM"),
}
PUBLISHED_EXTRAS = {
    "qwen3_next": {"full_attention_interval", "num_nextn_predict_layers", "mtp_num_hidden_layers",
                   "partial_rotary_factor"},
    "qwen3_5_text": {"full_attention_interval", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings",
                     "attn_output_gate", "partial_rotary_factor"},
    "qwen3_5_moe_text": {"full_attention_interval", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings",
                         "attn_output_gate", "partial_rotary_factor", "norm_topk_prob", "decoder_sparse_step",
                         "mlp_only_layers"},
}  # fmt: skip
"""Fields published configs carry that the transformers 5.12.1 classes do not declare."""


def _provider(model_type: str, **overrides: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(HF config, the real bridge's provider, the flattened HF view) for the tiny fixture of `model_type`."""
    import transformers

    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge import AutoBridge

    spec, arch = CASES[model_type]
    cls = getattr(transformers, spec.config_class)
    hf = cls(**{**spec.config, **overrides})
    hf.architectures = [arch]
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    return hf, provider, {**flatten(cls().to_dict()), **flatten(hf.to_dict())}


def _getter(provider: Any) -> Any:
    def get(name: str) -> Any:
        if not hasattr(provider, name):
            raise AttributeError(name)
        return getattr(provider, name)

    return get


def _failing(model_type: str, provider: Any, view: dict[str, Any]) -> dict[str, Any]:
    """Label -> finding of every provider-side rule (the `model.*` rules need a built model) that fails."""
    rules = [r for r in TABLES[model_type] if not r.megatron.startswith("model.")]
    return {f.tensor: f for f in (check_rule(r, view, _getter(provider)) for r in rules) if f is not None}


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_every_field_of_the_config_class_and_of_published_configs_is_named(model_type: str) -> None:
    import transformers

    spec, _ = CASES[model_type]
    cls = getattr(transformers, spec.config_class)
    rules = TABLES[model_type]
    named = {f.split(".")[0] for rule in rules for f in (*rule.hf, *rule.also)}
    fields = {*cls.__annotations__, *PUBLISHED_EXTRAS[model_type]}
    assert sorted(fields - named - set(IGNORED)) == []
    source, defaults = flatten(cls(**spec.config).to_dict()), flatten(cls().to_dict())
    assert uncovered(source, defaults, Coverage(rules=rules)) == []


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_the_real_bridge_provider_satisfies_every_rule_for_the_tiny_fixture(model_type: str) -> None:
    _, provider, view = _provider(model_type)
    assert _failing(model_type, provider, view) == {}


def test_a_collapsed_interval_and_a_wrong_gdn_head_count_are_named_by_field() -> None:
    """Planted on the real Qwen3NextBridge provider: the schedule [full, linear, linear, full] as interval 4 (what a
    bridge that collapses layer_types to full_attention_interval builds) and 2 value heads where HF has 4."""
    _, provider, view = _provider("qwen3_next")
    provider.linear_attention_freq = 4
    provider.linear_num_value_heads = 2
    found = _failing("qwen3_next", provider, view)
    assert sorted(found) == ["layer_types -> linear_attention_freq", "linear_num_value_heads -> linear_num_value_heads"]
    schedule = found["layer_types -> linear_attention_freq"]
    assert schedule.kind == "mismatch"
    assert schedule.detail["expected"] == "[0, 1, 1, 0]" and schedule.detail["actual"] == "[1, 1, 1, 0]"
    assert found["linear_num_value_heads -> linear_num_value_heads"].detail["actual"] == "2"


def test_qwen3_next_without_top_k_renormalisation_and_with_dense_layers_is_a_real_bridge_mismatch() -> None:
    """The Qwen3-Next bridge fixes moe_router_pre_softmax False (qwen3_next_bridge.py:71) and never sets
    moe_layer_freq: HF's norm_topk_prob false and mlp_only_layers are named, not passed."""
    _, provider, view = _provider("qwen3_next", norm_topk_prob=False, mlp_only_layers=[1])
    found = _failing("qwen3_next", provider, view)
    assert sorted(found) == [
        "decoder_sparse_step+mlp_only_layers+num_experts -> moe_layer_freq",
        "norm_topk_prob -> moe_router_pre_softmax",
    ]
    assert found["decoder_sparse_step+mlp_only_layers+num_experts -> moe_layer_freq"].detail["expected"] == (
        "[1, 0, 1, 1]"
    )


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_megatron_to_hf_config_loses_the_schedule_and_gdn_geometry_and_the_bug_names_it(model_type: str) -> None:
    """The real bridge's megatron_to_hf_config (the generic one, model_bridge.py:695) writes no layer_types, GDN head
    counts / dims or shared expert width: the exported config gets the class defaults, and exactly the rules that
    read them differ (the known-bug entry explains each)."""
    import transformers

    hf, provider, view = _provider(model_type)
    from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge

    bridge = next(b for b in MegatronModelBridge.__subclasses__() if getattr(b, "MODEL_TYPE", None) == model_type)
    cls = type(hf)
    exported = {**flatten(cls().to_dict()), **flatten(cls(**bridge.megatron_to_hf_config(provider)).to_dict())}
    get = _getter(provider)
    differ = sorted(
        "+".join(r.hf) for r in TABLES[model_type] if r.hf and r.expect(view, get) != r.expect(exported, get)
    )
    moe = model_type != "qwen3_5_text"
    assert differ == [
        "layer_types", "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        "linear_value_head_dim", *(["shared_expert_intermediate_size"] if moe else []),
    ]  # fmt: skip
    for name in differ:
        assert GDN_CONFIG_EXPORT_LOSES_SCHEDULE.explains("0.6.2", "config", f"{name} (megatron_to_hf_config)",
                                                         "roundtrip-mismatch")  # fmt: skip
    assert transformers.__version__ == "5.12.1"
