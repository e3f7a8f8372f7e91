"""Geometry: one reader of HF config shapes, with one text_config precedence, tolerant of missing fields."""

import pytest

from convcheck.errors import BadInput
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mappings import MappingError
from convcheck.models.mapping_registry import build_registry


def test_text_config_wins_over_the_top_level() -> None:
    config = {"num_attention_heads": 8, "num_experts": 8, "hidden_size": 64,
              "text_config": {"num_attention_heads": 4, "num_local_experts": 4}}  # fmt: skip
    geometry = Geometry.from_hf_config(config)
    assert (geometry.num_heads, geometry.num_experts, geometry.hidden, geometry.head_dim) == (4, 4, 64, 16)


def test_ernies_moe_num_experts_counts_as_experts() -> None:
    """ERNIE 4.5 MoE names its expert count moe_num_experts: EP2 is a possible layout of it."""
    config = {"num_attention_heads": 4, "moe_num_experts": 4, "hidden_size": 64}
    assert Geometry.from_hf_config(config).num_experts == 4
    ParallelLayout(ep=2).validate_for(config)
    with pytest.raises(BadInput, match="ep=3 does not divide num_experts=4"):
        ParallelLayout(ep=3).validate_for(config)


def test_a_speech_out_model_reads_its_thinker() -> None:
    """Qwen3-Omni's experts live in thinker_config.text_config (the bridge converts the thinker; the talker has
    experts of its own sizes): EP2 is possible, the thinker's sizes win over the talker's and the top level's."""
    config = {"model_type": "qwen3_omni_moe", "talker_config": {"text_config": {"num_experts": 8, "hidden_size": 32}},
              "thinker_config": {"text_config": {"num_experts": 4, "hidden_size": 64, "num_attention_heads": 4,
                                                 "vocab_size": 256}}}  # fmt: skip
    geometry = Geometry.from_hf_config(config)
    assert (geometry.num_experts, geometry.hidden, geometry.vocab) == (4, 64, 256)
    ParallelLayout(ep=2).validate_for(config)
    with pytest.raises(BadInput, match="the model has no experts"):
        ParallelLayout(ep=2).validate_for({"talker_config": config["talker_config"], "num_attention_heads": 4})


def test_layout_reads_the_same_precedence() -> None:
    config = {"num_attention_heads": 8, "text_config": {"num_attention_heads": 6}}
    ParallelLayout(tp=3).validate_for(config)
    with pytest.raises(BadInput, match="does not divide num_attention_heads=6"):
        ParallelLayout(tp=4).validate_for(config)


def test_missing_and_non_integer_fields_read_as_zero() -> None:
    geometry = Geometry.from_hf_config({"num_attention_heads": True, "hidden_size": "32", "n_layer": 3})
    assert geometry == Geometry(num_layers=3)
    assert geometry.missing_for_mappings() == ("hidden_size", "num_attention_heads", "vocab_size")
    ParallelLayout(tp=8, pp=1).validate_for({})


def test_hybrid_layer_list_gives_layers_and_mamba() -> None:
    listed = Geometry.from_hf_config({"layers_block_type": ["mamba", "attention", "moe"]})
    assert listed.num_layers == 3 and listed.has_mamba_layers
    pattern_only = Geometry.from_hf_config({"hybrid_override_pattern": "M*-ME"})
    assert pattern_only.num_layers == 5 and not pattern_only.has_mamba_layers  # as layout validation always read it


def test_registry_names_the_missing_field() -> None:
    geometry = Geometry.from_hf_config({"num_attention_heads": 4, "vocab_size": 16})
    with pytest.raises(MappingError, match="HF config lacks hidden_size$"):
        build_registry(
            "Qwen3ForCausalLM", geometry, ["embedding.word_embeddings.weight"], ["model.embed_tokens.weight"]
        )
