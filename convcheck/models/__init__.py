"""Every supported model architecture, one module per family, and the lookups the registries and oracles read.

A new architecture is a module here (its HF class names and model_type, explicit-mapping rules, config table and
tiny fixtures, as an `Architecture`) plus one entry in SUPPORTED.
"""

from convcheck.models import dense, nemotron_h, qwen3_moe
from convcheck.models.architecture import Architecture, unique_index
from convcheck.models.config_rules import FieldRule
from convcheck.models.fixture_spec import FixtureSpec

SUPPORTED: tuple[Architecture, ...] = (
    dense.QWEN2,
    dense.QWEN3,
    qwen3_moe.QWEN3_MOE,
    dense.LLAMA,
    nemotron_h.NEMOTRON_H,
)
"""Every supported architecture; config tables and `tiny:` fixtures are listed in this order."""

BY_HF_CLASS: dict[str, Architecture] = unique_index(
    ((hf_class, arch) for arch in SUPPORTED for hf_class in arch.hf_classes), "HF architecture class"
)
"""HF `architectures` class name -> its architecture (the explicit-mapping registry's lookup)."""
BY_MODEL_TYPE: dict[str, Architecture] = unique_index(((arch.model_type, arch) for arch in SUPPORTED), "model_type")
"""HF `model_type` -> its architecture (the config oracle's lookup)."""
TABLES: dict[str, tuple[FieldRule, ...]] = {model_type: arch.config_rules for model_type, arch in BY_MODEL_TYPE.items()}
"""model_type -> config-table rules."""
FIXTURES: dict[str, FixtureSpec] = unique_index(
    ((spec.name, spec) for arch in SUPPORTED for spec in arch.fixtures), "fixture name"
)
"""Fixture name (after `tiny:`) -> spec, in listing order."""

__all__ = ["BY_HF_CLASS", "BY_MODEL_TYPE", "FIXTURES", "SUPPORTED", "TABLES", "Architecture"]
