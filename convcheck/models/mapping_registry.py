"""A family's explicit-mapping registry: the rules its Architecture names (convcheck.models), built for one
checkpoint."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from convcheck.errors import NotCovered
from convcheck.hf.geometry import Geometry
from convcheck.mappings.registry import MappingRegistry, registry_from_rules
from convcheck.models import BY_HF_CLASS


def build_registry(
    architecture: str,
    geometry: Geometry,
    megatron_names: Iterable[str],
    hf_names: Iterable[str],
    *,
    tied: bool = False,
    strict: bool = True,
) -> MappingRegistry:
    """The explicit-mapping registry of HF class `architecture`: every Megatron name mapped once by its family's rules;
    strict: CoverageError names every unmapped or doubly mapped parameter and every HF tensor produced 0 or 2+ times."""
    family = BY_HF_CLASS.get(architecture)
    if family is None or family.mapping_rules is None:
        mapped = sorted(name for name, arch in BY_HF_CLASS.items() if arch.mapping_rules is not None)
        raise NotCovered(f"convcheck has no explicit mappings for {architecture} (it has them for {', '.join(mapped)})")
    module, function = family.mapping_rules.split(":")
    rules = getattr(importlib.import_module(module), function)(tied)
    return registry_from_rules(architecture, rules, geometry, megatron_names, hf_names, tied=tied, strict=strict)
