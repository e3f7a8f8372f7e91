"""Which HF tensors a target's quantization_config quantizes (pure Python, no torch).

A pattern of `ignore` / `ignored_layers` / `modules_to_not_convert` names a module (an HF tensor name without its
`.weight`). It matches a module when it is the module, a dotted suffix of it (`mlp.gate` matches
`model.layers.0.mlp.gate`), a dotted prefix of it (`model.layers.0` matches `model.layers.0.mlp.gate`), or, spelled
`re:REGEX`, when REGEX matches the whole module name (compressed-tensors' spelling). Never by a bare substring:
`mlp.gate` does not match `model.layers.0.mlp.gate_up_proj`. The readings that do (a substring test, transformers'
`re.match(pattern, name)` with its unescaped dots and no end anchor, or `name.endswith(pattern)`) are named by
`over_matches` where they would take a module the pattern does not name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

IGNORE_KEYS = ("ignore", "ignored_layers", "modules_to_not_convert")
"""The quantization_config keys that list modules left unquantized (compressed-tensors, vLLM fp8, transformers)."""

ALWAYS_UNQUANTIZED = ("embed_tokens", "lm_head", "shared_head.head", "mlp.gate", "mlp.router", "mlp.shared_expert_gate")
"""Modules a rollout engine keeps in bf16 whatever the config lists: vLLM builds the vocabulary embeddings and LM heads
(the model's and an MTP layer's copies, `model.layers.N.embed_tokens`, `shared_head.head`) without the fp8 method and
the MoE routers (`mlp.gate`, GPT-OSS's `mlp.router`, Qwen2-MoE's `shared_expert_gate`) with quant_config=None; only
2-D `.weight` tensors are quantized at all (norms and biases never)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class QuantTarget:
    """What the rollout expects: its block and the patterns it leaves unquantized."""

    block: tuple[int, int] | None
    """weight_block_size of the config ([rows, cols]); None when it names none."""
    ignore: tuple[str, ...]
    """The config's own patterns (IGNORE_KEYS, in order)."""
    source: str
    """Where the config came from (a file, the checkpoint's config.json, or the default)."""

    @property
    def patterns(self) -> tuple[str, ...]:
        return (*ALWAYS_UNQUANTIZED, *self.ignore)


def target_from_config(config: Mapping | None, source: str) -> QuantTarget:
    """The QuantTarget of a quantization_config dict (None: quantize every 2-D weight but ALWAYS_UNQUANTIZED)."""
    if not config:
        return QuantTarget(block=None, ignore=(), source=source)
    block = config.get("weight_block_size")
    ignore: list[str] = []
    for key in IGNORE_KEYS:
        ignore += [str(p) for p in config.get(key) or ()]
    return QuantTarget(block=tuple(int(b) for b in block) if block else None, ignore=tuple(ignore), source=source)


def module_of(name: str) -> str:
    """The module an HF tensor belongs to: its name without the last component."""
    return name.rpartition(".")[0]


def matches(pattern: str, module: str) -> bool:
    """True when `pattern` names `module` (itself, a dotted suffix or prefix, or `re:` fully)."""
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], module) is not None
    pattern = pattern.removesuffix(".weight")
    return module == pattern or module.endswith("." + pattern) or module.startswith(pattern + ".")


def loose_reading(pattern: str, module: str) -> str:
    """The loose reading under which `pattern` takes `module` although it does not name it ("" when none does)."""
    if pattern.startswith("re:") or matches(pattern, module):
        return ""
    bare = pattern.removesuffix(".weight")
    if bare in module:
        return "substring"
    try:
        if re.match(bare, module):
            return "re.match prefix"
    except re.error:
        pass
    return "endswith" if module.endswith(bare) else ""


def first_match(patterns: Iterable[str], module: str) -> str | None:
    """The first pattern that names `module`, else None."""
    return next((p for p in patterns if matches(p, module)), None)


def expected_quantized(shapes: Mapping[str, Sequence[int]], target: QuantTarget) -> dict[str, str]:
    """HF tensor name -> "" for each tensor the target quantizes, or the reason it does not (every name of `shapes`):
    a 2-D `.weight` whose module no pattern names is quantized."""
    out = {}
    for name, shape in shapes.items():
        if not name.endswith(".weight") or len(shape) != 2:
            out[name] = "not a 2-D weight"
            continue
        pattern = first_match(target.patterns, module_of(name))
        out[name] = f"its module is named by the pattern {pattern!r}" if pattern is not None else ""
    return out


def over_matches(patterns: Iterable[str], modules: Iterable[str]) -> list[tuple[str, str, str]]:
    """(pattern, module, reading) for each module a loose reading of a pattern takes though the pattern does not name
    it (e.g. `mlp.gate` taking `model.layers.0.mlp.gate_up_proj` as a substring)."""
    out = []
    for pattern in patterns:
        for module in modules:
            reading = loose_reading(pattern, module)
            if reading:
                out.append((pattern, module, reading))
    return out
