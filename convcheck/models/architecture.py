"""Architecture: one supported HF architecture and everything convcheck knows about it, as data."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from convcheck.models.config_rules import FieldRule
from convcheck.models.fixture_spec import FixtureSpec
from convcheck.models.upstream_bug import UpstreamBug


@dataclass(frozen=True, kw_only=True, slots=True)
class Architecture:
    """The names an HF architecture goes by, its explicit mappings, its config table and its tiny fixtures."""

    hf_classes: tuple[str, ...]
    """HF `architectures` class names it serves (the key of the explicit-mapping lookup)."""
    model_type: str
    """HF `model_type` (the key of the config-table lookup)."""
    mapping_rules: str | None
    """`module:function` of the rank-side function (tied embeddings -> the rules mapping every Megatron parameter;
    see convcheck.models.mapping_registry.build_registry); None where convcheck has
    no explicit mappings for the family yet (the mapping oracle then reports it not covered)."""
    config_rules: tuple[FieldRule, ...]
    """The config oracle's table for this model_type."""
    fixtures: tuple[FixtureSpec, ...] = ()
    """Built-in `tiny:` fixtures, in listing order."""
    upstream_bugs: tuple[UpstreamBug, ...] = ()
    """Real megatron-bridge bugs of this family that convcheck names (see convcheck.models.upstream_bug)."""


def unique_index[T](pairs: Iterable[tuple[str, T]], what: str) -> dict[str, T]:
    """A dict of `pairs`; ValueError naming the first key claimed twice (two modules serving one name)."""
    index: dict[str, T] = {}
    for key, value in pairs:
        if key in index:
            raise ValueError(f"{what} {key!r} is claimed twice in convcheck.models")
        index[key] = value
    return index
