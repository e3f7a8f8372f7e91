"""The generic registry: every Megatron parameter -> exactly one explicit mapping, checked both ways.

Which rules apply is looked up by HF architecture class in convcheck.models (one module per model family).
"""

from __future__ import annotations

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

    Kept per process by content (a trainer's live checks ask again with the same model): the names, the geometry and
    the rules' code, each rule function's closure and the module globals its code names (a class or helper rebound
    since is another key); the mappings are frozen, so one registry serves every caller."""
    missing = geometry.missing_for_mappings()
    if missing:
        raise MappingError(f"HF config lacks {', '.join(missing)}")
    rules = tuple(rules)
    megatron_names, hf_names = frozenset(megatron_names), frozenset(hf_names)
    alive: list[Any] = []
    key = (architecture, geometry, megatron_names, hf_names, tied, strict, rules_key(rules, alive))
    try:
        held = _BUILT.get(key)
    except TypeError:  # a geometry field that cannot be hashed: built afresh
        key, held = None, None
    if held is None:
        held = _build(architecture, rules, geometry, megatron_names, hf_names, tied=tied, strict=strict)
        if key is not None:
            if len(_BUILT) >= 4:
                oldest = next(iter(_BUILT))
                del _BUILT[oldest]
                _ALIVE.pop(oldest, None)
            _BUILT[key] = held
            _ALIVE[key] = alive
    if held.problems and strict:
        head = f"mappings for {architecture} do not cover the model exactly once: "
        raise CoverageError(head + "; ".join(held.problems))
    return held


_BUILT: dict[tuple[Any, ...], MappingRegistry] = {}
"""registry_from_rules' registries by content (the last four)."""
_ALIVE: dict[tuple[Any, ...], list[Any]] = {}
"""The unhashable objects a key names by id, held while the key is (so no other object takes the id)."""


def rules_key(rules: tuple[MappingRule, ...], alive: list[Any]) -> tuple[Any, ...]:
    """What decides the rules' mappings besides their inputs: each pattern, and each function's code, closure values,
    defaults and the module globals its code names, followed into the functions among them (an unhashable value by
    its id, appended to `alive`)."""
    seen: set[int] = set()
    return tuple(
        (rule.pattern, _code_key(rule.build, seen, alive), _code_key(rule.when, seen, alive)) for rule in rules
    )


def _code_key(value: Any, seen: set[int], alive: list[Any]) -> Any:
    code = getattr(value, "__code__", None)
    if code is None or not hasattr(value, "__globals__"):
        try:
            hash(value)
            return value
        except TypeError:
            alive.append(value)
            return ("by-id", id(value))
    if id(value) in seen:
        return ("again", code)
    seen.add(id(value))
    cells = []
    for cell in value.__closure__ or ():
        try:
            cells.append(_code_key(cell.cell_contents, seen, alive))
        except ValueError:  # an empty cell
            cells.append(("empty",))
    names = value.__globals__
    globs = tuple(
        (n, _code_key(names[n], seen, alive)) for n in code.co_names if n in names and not _is_module(names[n])
    )
    defaults = tuple(_code_key(d, seen, alive) for d in value.__defaults__ or ())
    return (code, tuple(cells), globs, defaults)


def _is_module(value: Any) -> bool:
    return type(value).__name__ == "module"


def _build(
    architecture: str,
    rules: tuple[MappingRule, ...],
    geometry: Geometry,
    megatron_names: frozenset[str],
    wanted: frozenset[str],
    *,
    tied: bool,
    strict: bool,
) -> MappingRegistry:
    """registry_from_rules' work: every name matched and mapped; the problems listed, sorted."""
    compiled = [(re.compile(rule.pattern), rule.build, rule.when, literal_tail(rule.pattern)) for rule in rules]
    problems: list[str] = []
    mappings: dict[str, TensorMapping] = {}
    copies: set[str] = set()
    for name in sorted(megatron_names):
        hits = [
            (p, m, make)
            for p, make, when, tail in compiled
            if name.endswith(tail) and (m := p.fullmatch(name)) is not None and (when is None or when(m, wanted))
        ]
        if not hits:
            problems.append(f"{name}: Megatron parameter has no mapping")
            continue
        if len(hits) > 1:
            patterns = ", ".join(p.pattern for p, _, _ in hits)
            problems.append(f"{name}: Megatron parameter has {len(hits)} mappings ({patterns})")
            continue
        _, match, make = hits[0]
        mappings[name] = make(match, geometry)
        if tied and name == "output_layer.weight":
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
