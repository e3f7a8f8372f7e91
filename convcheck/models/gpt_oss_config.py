"""The config oracle's table for GPT-OSS (gpt_oss)."""

from __future__ import annotations

from convcheck.models.config_rules import FieldRule

GPT_OSS_TABLE: tuple[FieldRule, ...] = ()
