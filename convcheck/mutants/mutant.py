"""One catalog entry: a planted bug as plain data (hook, fixture, layout, catchers, targets), and the helpers the
catalog modules spell targets with."""

from __future__ import annotations

from dataclasses import dataclass

FORWARD = "logits"
"""The target for a bug that changes the loaded model's forward (the logits oracle names no tensor)."""

_M = "convcheck.mutants."


@dataclass(frozen=True, kw_only=True, slots=True)
class Mutant:
    """One planted bug and where and by what it must be caught."""

    name: str
    description: str
    hook: str
    """`module:function` run in every rank before the model is built."""
    fixture: str
    """A built-in fixture, `tiny:<name>`."""
    layout: str
    """The layout `--quick` runs it at, spelled like "tp2ep2"."""
    catches: tuple[str, ...]
    """Oracles that must catch it (a miss there means the gate got weaker)."""
    targets: tuple[str, ...]
    """fnmatch patterns of every finding name it can cause; `logits` when it changes the forward."""
    more_layouts: tuple[str, ...] = ()
    """Further layouts a full (not --quick) selftest also runs it at."""
    experts: str = "sequential"
    """MoE expert layout (`--experts`)."""
    spec: str = "local"
    """Layer specs (`--spec`): "local", or "te" for a bug of the Transformer Engine layout's own mappings."""
    via: str = "hook"
    """Where `hook` is planted: "hook" (`--hook`, every rank before the model is built), "sender" (`--sender`, the
    ranks' export stream) or "engine-receiver" (`--engine-receiver`, called inside the engine process)."""
    options: tuple[tuple[str, str], ...] = ()
    """Oracle options its launches set, by key (e.g. (("engine_delta", "on"),))."""
    engine_packing: bool = False
    """A misuse of the engine that is a bug only where its CPU backend packs dense weights away at load (AMX / oneDNN
    hosts, convcheck.rollout.environment.engine_packs_weights); elsewhere its launch is skipped, saying why."""

    @property
    def layouts(self) -> tuple[str, ...]:
        return (self.layout, *self.more_layouts)


VIAS = ("hook", "sender", "engine-receiver")
"""The ways a mutant is planted (Mutant.via)."""


def qk_targets(layer: int) -> tuple[str, ...]:
    """Finding names of a q/k bug in `layer`: the HF q and k projections and Megatron's fused QKV."""
    return (f"*.layers.{layer}.self_attn.[qk]_proj.weight", f"decoder.layers.{layer}.self_attention.linear_qkv.weight")


def rule_targets(hf: str, megatron: str) -> tuple[str, ...]:
    """The config oracle's finding names for one table rule: the rule and its megatron_to_hf_config roundtrip."""
    return (f"{hf} -> {megatron}", f"{hf} (megatron_to_hf_config)")


HOOKS = "convcheck.mutants."
"""Prefix of the hooks in this package (`HOOKS + "bridge:swap_qk_head0"`)."""
QWEN3, QWEN2, LLAMA, MOE, NEMOTRON = "tiny:qwen3", "tiny:qwen2", "tiny:llama", "tiny:qwen3-moe", "tiny:nemotron-h"
DEEPSEEK, MOONLIGHT, GLM_FLASH = "tiny:deepseek-v3", "tiny:moonlight", "tiny:glm4.7-flash"
KIMI = "tiny:kimi-k2"
QWEN3_NEXT, QWEN35 = "tiny:qwen3-next", "tiny:qwen3.5"
MISTRAL = "tiny:mistral"
