"""GPT-OSS explicit mappings."""

from __future__ import annotations

from convcheck.mappings.registry import MappingRule


def gpt_oss_rules(tied: bool) -> list[MappingRule]:
    return []
