"""The generic registry: every Megatron parameter -> exactly one explicit mapping, checked both ways.

Which rules apply is looked up by HF architecture class in convcheck.models (one module per model family).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from convcheck.hf.geometry import Geometry
from convcheck.mappings.base import CoverageError, MappingError, TensorMapping


@dataclass(frozen=True, slots=True)
class MappingRule:
    """Megatron parameter names (a regular expression matched in full) and how to map each one."""

    pattern: str
    build: Callable[[re.Match[str], Geometry], TensorMapping]
    """(the match of a Megatron name, the model's geometry) -> that parameter's mapping."""
    when: Callable[[re.Match[str], frozenset[str]], bool] | None = None
    """(the match, the model's HF names) -> whether the rule applies (the checkpoint's spelling, e.g. fused experts);
    None: always."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MappingRegistry:
    """Megatron global name -> its mapping, for one model; `problems` is empty when built strictly."""

    architecture: str
    mappings: dict[str, TensorMapping]
    problems: tuple[str, ...] = ()
    """Coverage problems found (only non-empty when built with strict=False)."""
    copies: frozenset[str] = field(default_factory=frozenset)
    """Megatron names that copy another parameter's HF tensor (tied output layer) and produce nothing."""

    def get(self, megatron: str) -> TensorMapping | None:
        return self.mappings.get(megatron)


def registry_from_rules(
    architecture: str,
    rules: Iterable[MappingRule],
    geometry: Geometry,
    megatron_names: Iterable[str],
    hf_names: Iterable[str],
    *,
    tied: bool = False,
    strict: bool = True,
) -> MappingRegistry:
    """Map every Megatron name once by `rules` (one architecture's, see convcheck.models.build_registry); strict:
    CoverageError names every unmapped or doubly mapped parameter and every HF tensor produced zero or two+ times.

    Built afresh on every call: what a registry holds depends on its mapping classes' behaviour at build time (their
    `hf_names`), which a planted bug can change without rebinding anything a key could see."""
    missing = geometry.missing_for_mappings()
    if missing:
        raise MappingError(f"HF config lacks {', '.join(missing)}")
    held = _build(architecture, tuple(rules), geometry, frozenset(megatron_names), frozenset(hf_names), tied=tied)
    if held.problems and strict:
        head = f"mappings for {architecture} do not cover the model exactly once: "
        raise CoverageError(head + "; ".join(held.problems))
    return held


def _build(
    architecture: str,
    rules: tuple[MappingRule, ...],
    geometry: Geometry,
    megatron_names: frozenset[str],
    wanted: frozenset[str],
    *,
    tied: bool,
) -> MappingRegistry:
    """registry_from_rules' work: every name matched and mapped; the problems listed, sorted."""
    compiled = [
        (re.compile(rule.pattern), rule.build, rule.when, literal_tail(rule.pattern), literal_runs(rule.pattern))
        for rule in rules
    ]
    longest = max((len(rule[3]) for rule in compiled), default=0)
    by_end: dict[str, list[Any]] = {}  # a name's last `longest` characters -> the rules whose tail it ends with
    problems: list[str] = []
    mappings: dict[str, TensorMapping] = {}
    copies: set[str] = set()
    for name in sorted(megatron_names):
        end = name[-longest:] if longest else ""
        candidates = by_end.get(end)
        if candidates is None:
            candidates = by_end[end] = [rule for rule in compiled if end.endswith(rule[3])]
        hits = []
        for p, make, when, _, runs in candidates:
            for run in runs:
                if run not in name:
                    break
            else:
                m = p.fullmatch(name)
                if m is not None and (when is None or when(m, wanted)):
                    hits.append((p, m, make))
        if not hits:
            problems.append(f"{name}: Megatron parameter has no mapping")
            continue
        if len(hits) > 1:
            patterns = ", ".join(p.pattern for p, _, _ in hits)
            problems.append(f"{name}: Megatron parameter has {len(hits)} mappings ({patterns})")
            continue
        _, match, make = hits[0]
        mappings[name] = make(match, geometry)
        if tied and (name == "output_layer.weight" or name.endswith(".output_layer.weight")):
            copies.add(name)
    produced = Counter(
        hf for name, m in mappings.items() if name not in copies and not hasattr(m, "fused_part") for hf in m.hf_names
    )
    problems += _fused_parts(mappings, produced)
    for hf in sorted(wanted | set(produced)):
        count = produced.get(hf, 0)
        if hf not in wanted:
            problems.append(f"{hf}: produced by a mapping but not an HF tensor of the model")
        elif count != 1:
            problems.append(f"{hf}: HF tensor would be produced {count} times")
    return MappingRegistry(
        architecture=architecture, mappings=mappings, problems=tuple(sorted(problems)), copies=frozenset(copies)
    )


@functools.lru_cache(maxsize=1024)
def literal_tail(pattern: str) -> str:
    """The characters every full match of `pattern` ends with (its trailing literals; "" when it ends otherwise or
    sets flags): a name that does not end with them cannot match, so the rule's expression need not run."""
    try:
        from re import _parser  # type: ignore[attr-defined]

        parsed = _parser.parse(pattern)
    except (ImportError, AttributeError):  # another Python's private parser: every rule's expression runs
        return ""
    if parsed.state.flags & ~(re.UNICODE | re.DEBUG):
        return ""
    chars = []
    for op, value in reversed(list(parsed)):
        if op is not _parser.LITERAL:
            break
        chars.append(chr(value))
    return "".join(reversed(chars))


@functools.lru_cache(maxsize=1024)
def literal_runs(pattern: str) -> tuple[str, ...]:
    """The literal stretches of `pattern` outside any group, repeat or class (every full match contains each one;
    none when it sets flags or Python's private parser is another): a name lacking one cannot match."""
    try:
        from re import _parser  # type: ignore[attr-defined]

        parsed = _parser.parse(pattern)
    except (ImportError, AttributeError):
        return ()
    if parsed.state.flags & ~(re.UNICODE | re.DEBUG):
        return ()
    runs, chars = [], []
    for op, value in [*list(parsed), (None, None)]:
        if op is _parser.LITERAL:
            chars.append(chr(value))
        elif chars:
            runs.append("".join(chars))
            chars = []
    return tuple(runs)


def _fused_parts(mappings: dict[str, TensorMapping], produced: Counter[str]) -> list[str]:
    """Count a fused HF tensor (convcheck.mappings.fused_experts) produced once when each of its slices is produced
    exactly once; the problems of one whose slices are missing or doubled."""
    slices: dict[str, list[int]] = {}
    total: dict[str, int] = {}
    for mapping in mappings.values():
        part = getattr(mapping, "fused_part", None)
        if part is not None:
            slices.setdefault(part[0], []).append(part[1])
            total[part[0]] = part[2]
    problems = []
    for hf, got in sorted(slices.items()):
        counts = Counter(got)
        missing = [e for e in range(total[hf]) if counts[e] == 0]
        doubled = sorted(e for e, n in counts.items() if n > 1)
        if missing or doubled:
            problems.append(f"{hf}: slices {missing} are never produced, slices {doubled} more than once")
        else:
            produced[hf] += 1
    return problems
