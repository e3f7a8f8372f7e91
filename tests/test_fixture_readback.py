"""convcheck.fixtures.readback: a built-in fixture the installed transformers reads otherwise stops verify (exit 2)."""

import shutil
from pathlib import Path

import pytest
import transformers

from convcheck.errors import BadInput
from convcheck.fixtures.build import build_fixture
from convcheck.fixtures.readback import check_readback, fixture_of, misread_fields, misread_rope, structural_fields
from convcheck.fixtures.specs import get_spec


def test_structural_fields_are_the_integers_of_nested_configs() -> None:
    fields = dict(structural_fields(get_spec("tiny:qwen3-vl-moe").config))
    assert fields["text_config.num_experts"] == 8
    assert "text_config.tie_word_embeddings" not in fields  # a bool is not a size
    assert all(type(v) is int for v in fields.values())


def test_a_fixture_read_as_written_passes_and_a_misread_field_stops_with_its_name(tmp_path: Path) -> None:
    """transformers 5.3.0 reads tiny:qwen3-vl-moe's num_local_experts as the default num_experts=60 (its config class
    knows the field only as num_experts): planted here by setting the real config's field to that default."""
    folder = build_fixture("tiny:qwen3-vl-moe")
    assert fixture_of(folder) == get_spec("tiny:qwen3-vl-moe")
    config = transformers.AutoConfig.from_pretrained(folder)
    assert misread_fields(get_spec("tiny:qwen3-vl-moe"), config) == []
    check_readback(folder, config, transformers.__version__)

    config.text_config.num_experts = 60
    assert misread_fields(get_spec("tiny:qwen3-vl-moe"), config) == [("text_config.num_experts", 8, 60)]
    with pytest.raises(BadInput) as caught:
        check_readback(folder, config, "5.3.0")
    assert str(caught.value) == (
        "transformers 5.3.0 reads tiny:qwen3-vl-moe's text_config.num_experts as 60, not 8: its Qwen3VLMoeConfig "
        "does not read the field under the name the fixture's config.json holds, so this environment cannot build "
        "the fixture's model"
    )

    copy = tmp_path / "my-checkpoint"  # any other folder (a user's checkpoint) is not checked
    shutil.copytree(folder, copy)
    assert fixture_of(copy) is None
    check_readback(copy, config, "5.3.0")


def test_mrope_sections_read_as_no_rope_scaling_stop_with_their_name() -> None:
    """transformers 4.57 reads `rope_scaling` (None for a config.json that spells `rope_parameters`): tiny:qwen3-vl
    loses its mrope sections, and bridge 0.3.x raises at qwen3_vl_bridge.py:103. Planted on the pinned transformers
    by setting the real config's `rope_scaling` to None, which 5.12.1 takes as no rope parameters. A yarn scaling
    dropped the same way (tiny:deepseek-v3) leaves a model both sides build alike: not stopped."""
    folder = build_fixture("tiny:qwen3-vl")
    config = transformers.AutoConfig.from_pretrained(folder)
    assert misread_rope(get_spec("tiny:qwen3-vl"), config) == []
    config.text_config.rope_scaling = None
    assert misread_rope(get_spec("tiny:qwen3-vl"), config) == [
        ("text_config.rope_parameters.mrope_section", [2, 1, 1], None)
    ]
    with pytest.raises(BadInput) as caught:
        check_readback(folder, config, "4.57.6")
    assert str(caught.value).startswith(
        "transformers 4.57.6 reads tiny:qwen3-vl's text_config.rope_parameters.mrope_section as None, not [2, 1, 1]: "
    )
    deepseek = transformers.DeepseekV3Config(**get_spec("tiny:deepseek-v3").config)
    deepseek.rope_scaling = None
    assert misread_rope(get_spec("tiny:deepseek-v3"), deepseek) == []


@pytest.mark.parametrize(
    "name",
    ["deepseek-v3", "gpt-oss", "kimi-k2", "nemotron-3-mtp", "gemma4", "qwen3.5-vl-moe", "gemma4-vl", "gemma4-vl-moe"],
)
def test_the_pinned_transformers_reads_every_size_of_these_fixtures_as_written(name: str) -> None:
    """On the pinned transformers nothing is misread: a yarn `rope_parameters` dict is read as a dict, and a field
    transformers moves on load (original_max_position_embeddings) is not a size read otherwise."""
    config = transformers.AutoConfig.from_pretrained(build_fixture(f"tiny:{name}"))
    assert misread_fields(get_spec(f"tiny:{name}"), config) == []
