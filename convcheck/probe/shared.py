"""Probe slots shared by tasks that run the same code on shards of one geometry: the routed experts of every layer
(their mappings differ only in their layer and expert numbers), and the same parameter of successive decoder layers
(they differ only in their layer number). The first of a kind is probed; a task moved from it in a number not yet
confirmed is probed too and must equal the first's slots with the numbers of their HF names moved by the same
differences (for experts: the second expert of the first layer confirms the expert number, the first expert of the
second layer the layer number); the rest take those renamed slots. Every task's real output is still compared
bitwise against its own weight, so only the probe run is shared; without real outputs to check (the elements
oracle's probe alone) every task is probed (convcheck.probe.collect).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from convcheck.compare.bits import int_views_equal
from convcheck.probe.run import ProbeSlot
from convcheck.probe.stubs import EXPERT_ID as HF_EXPERT

MEGATRON_EXPERT = re.compile(r"local_experts\.(\d+)\.|\.(?:weight|bias)(\d+)$")
"""The expert number in a Megatron expert parameter name (SequentialMLP's local_experts.N, TEGroupedMLP's weightN)."""
LAYER = re.compile(r"((?:^|\.)layers\.)(\d+)(?=\.)")
"""A layer number in a Megatron or HF name (`decoder.layers.N.`, `model.layers.N.`, `mtp.layers.N.`)."""
_HF_NUMBERS = {"expert": HF_EXPERT, "layer": LAYER}
"""Where each kind of number sits in an HF name (group 1 what precedes it, group 2 the number)."""


@dataclass
class _Entry:
    at: dict[str, int]
    """The first probed task's numbers: {'layer': L} or {'layer': L, 'expert': E} (L is -1 where names have none)."""
    slots: dict[str, ProbeSlot]
    confirmed: dict[str, bool] = field(default_factory=dict)
    """Per number: True once a task moved in it was probed and matched the renamed slots, False when it did not
    (every later task moved in it is probed); absent until then."""
    names: list[tuple[str, tuple[tuple[str, int], ...]]] | None = None
    """Each slot's HF name as a format string with a field per number, and the (kind, number) of each field (made
    on the first rename)."""

    def renamed(self, shift: dict[str, int]) -> dict[str, ProbeSlot]:
        """The slots with each kind of number of their HF names moved by `shift[kind]`."""
        if self.names is None:
            self.names = [_template(slot.hf_name) for slot in self.slots.values()]
        out = {}
        for (form, fields), slot in zip(self.names, self.slots.values()):
            name = form.format(*[n + shift.get(kind, 0) for kind, n in fields])
            out[name] = ProbeSlot(hf_name=name, shape=slot.shape, runs=slot.runs, writer=slot.writer, owned=slot.owned)
        return out


class SharedProbes:
    """One check's shared probes, keyed by everything the probe run reads but the layer and expert numbers."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], _Entry] = {}
        self._configs: dict[int, tuple[Any, int]] = {}
        """id(config) -> (config, its number in _tokens): each module config's content read once per check."""
        self._tokens: dict[Any, int] = {}
        self.shared = 0
        """Tasks that took renamed slots instead of a probe run."""
        self.facts: dict[int, tuple[Any, Any, dict[str, Any]]] = {}
        """id(runs) -> (runs, the slot's shape, writer and owned, its record fields): renamed slots share their runs,
        so their records share these (convcheck.probe.collect)."""

    def slots(self, task: Any, rank: int, probe: Callable[[], dict[str, ProbeSlot]]) -> dict[str, ProbeSlot]:
        """The task's probe slots: `probe()` for the first task of a key and for one moved in a number not yet
        confirmed (checked against the first's renamed slots), renamed slots for the rest; `probe()` for a task of
        no layer that is not a routed expert."""
        parsed = _parsed(task)
        if parsed is None:
            return probe()
        found, hidden = parsed
        key = _key(task, rank, hidden, self._config)
        entry = self._entries.get(key)
        if entry is None:
            slots = probe()
            self._entries[key] = _Entry(at=found, slots=slots)
            return slots
        shift = {kind: n - entry.at[kind] for kind, n in found.items()}
        moved = [kind for kind, s in shift.items() if s]
        if not moved or any(entry.confirmed.get(kind) is False for kind in moved):
            return probe()
        renamed = entry.renamed(shift)
        unsure = [kind for kind in moved if kind not in entry.confirmed]
        if unsure:
            slots = probe()
            agree = same_slots(slots, renamed)
            entry.confirmed.update(dict.fromkeys(unsure, agree))
            return slots
        self.shared += 1
        return renamed

    def _config(self, config: Any) -> int:
        """A small number per distinct config content (config_token), read once per config object: layers often hold
        equal copies, and a key holding the whole token would hash it at every lookup."""
        held = self._configs.get(id(config))
        if held is None or held[0] is not config:
            number = self._tokens.setdefault(config_token(config), len(self._tokens))
            held = self._configs[id(config)] = (config, number)
        return held[1]


def _name(task: Any) -> str:
    return str(getattr(task.mapping, "megatron_param", "") or task.param_name)


def numbers(task: Any) -> dict[str, int] | None:
    """The numbers a shared probe moves for this task: {'layer', 'expert'} for a routed expert (layer -1 where its
    name has none), {'layer'} for another task of a layer; None for a task of neither, or without a weight."""
    parsed = _parsed(task)
    return None if parsed is None else parsed[0]


def probe_key(task: Any, rank: int, config: Callable[[Any], Any] | None = None) -> tuple[Any, ...]:
    """What the probe run of a routed-expert or layer task reads, its layer and expert numbers hidden: the mapping's
    class (and its delegate's), its name strings, the weight's geometry and TP attributes, the module's class and
    config content (through `config`, default config_token), and the rank."""
    experts = bool(getattr(task.mapping, "is_expert", False))
    return _key(task, rank, _parse(_name(task), experts)[2], config or config_token)


def _parsed(task: Any) -> tuple[dict[str, int], str] | None:
    """(`numbers(task)`, the task's Megatron name with its numbers hidden) from one pass over the name; None where
    `numbers` is None."""
    if task.param_weight is None:
        return None
    experts = bool(getattr(task.mapping, "is_expert", False))
    layer, expert, hidden = _parse(_name(task), experts)
    if experts:
        return None if expert < 0 else ({"layer": layer, "expert": expert}, hidden)
    return None if layer < 0 else ({"layer": layer}, hidden)


def _parse(name: str, experts: bool) -> tuple[int, int, str]:
    """(the first layer number LAYER finds or -1, the expert number MEGATRON_EXPERT finds or -1, `_hidden(name,
    experts)`) in one split of `name` at the dots (the regular expressions cost several times as much)."""
    parts = name.split(".")
    last = len(parts) - 1
    layer = expert = -1
    for i in range(1, last):  # a number followed by a dot: `layers.N.`, `local_experts.N.`, `experts.N.`
        part = parts[i]
        if not part.isdigit():
            continue
        before = parts[i - 1]
        if before == "layers":
            if layer < 0 and part.isdecimal():
                layer = int(part)
            parts[i] = "*"
        elif before.endswith("experts"):
            if expert < 0 and before.endswith("local_experts") and part.isdecimal():
                expert = int(part)
            if experts:
                parts[i] = "*"
    tail = parts[last]
    if last and tail.isdigit() and parts[last - 1].endswith("experts") and experts:
        parts[last] = "*"  # `...experts.N` ending the name
    for stem in ("weight", "bias"):
        digits = tail[len(stem) :]
        if last and tail.startswith(stem) and digits.isdigit():
            if expert < 0 and digits.isdecimal():
                expert = int(digits)
            if experts:
                parts[last] = stem + "*"
    return layer, expert, ".".join(parts)


def _key(task: Any, rank: int, hidden: str, config: Callable[[Any], Any]) -> tuple[Any, ...]:
    """probe_key with the task's Megatron name already hidden (`hidden`, of `_name(task)`)."""
    experts = bool(getattr(task.mapping, "is_expert", False))
    return ("expert" if experts else "layer", *_reads(task, rank, hidden, experts, config))


def config_token(config: Any) -> Any:
    """A hashable stand-in for a module config's content: a dataclass config field by field (plain values as they
    are, functools.partial by function and arguments, any other object by identity); any other config by identity.
    Layers that hold equal copies of one config (an MoE layer's experts do) get equal tokens."""
    if config is None or not dataclasses.is_dataclass(config):
        return ("id", id(config))
    return (type(config), tuple((f.name, _content(getattr(config, f.name, None))) for f in dataclasses.fields(config)))


def _content(value: Any) -> Any:
    """`value` as config_token compares it."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, enum.Enum, torch.dtype)):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_content(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple(sorted((repr(k), _content(v)) for k, v in value.items())))
    if isinstance(value, functools.partial):
        return (functools.partial, value.func, _content(value.args), _content(value.keywords))
    return ("id", id(value))


def _reads(task: Any, rank: int, hidden: str, experts: bool, config: Callable[[Any], Any]) -> tuple[Any, ...]:
    """The rank, the mapping's and its delegate's classes, its names with their numbers hidden (the Megatron one
    given as `hidden` when it is `_name(task)`), the weight's geometry and TP attributes, the module's class and its
    config through `config`."""
    mapping, weight, module = task.mapping, task.param_weight, task.megatron_module
    attrs = tuple(getattr(weight, a, None) for a in ("tensor_model_parallel", "partition_dim", "partition_stride"))
    delegate = getattr(mapping, "_mapping", None)
    megatron = getattr(mapping, "megatron_param", None)
    if not (isinstance(megatron, str) and megatron):  # else `_name(task)` is another string than the mapping's
        hidden = _hidden(megatron, experts)
    return (
        rank, type(mapping), type(delegate), hidden, _hidden(getattr(mapping, "hf_param", None), experts),
        tuple(weight.shape), weight.dtype, tuple(weight.stride()), weight.device, attrs,
        type(module), config(getattr(module, "config", None)),
    )  # fmt: skip


def _hidden(names: Any, experts: bool) -> Any:
    """A mapping's name (or dict of names) with its layer numbers hidden (`layers.N.`), and with `experts` its expert
    numbers too (`experts.N`, `local_experts.N`, a `weightN` / `biasN` ending): the numbers LAYER, HF_EXPERT and
    MEGATRON_EXPERT find, by splitting at the dots (a regular expression per name costs three times as much)."""
    if isinstance(names, dict):
        return tuple(sorted((str(k), _hidden(v, experts)) for k, v in names.items()))
    if not isinstance(names, str):
        return repr(names)
    parts = names.split(".")
    last = len(parts) - 1
    for i in range(1, last + 1):
        if parts[i].isdigit() and (
            (parts[i - 1] == "layers" and i < last) or (experts and parts[i - 1].endswith("experts"))
        ):
            parts[i] = "*"
    if experts:
        for stem in ("weight", "bias"):
            if parts[last].startswith(stem) and parts[last][len(stem) :].isdigit() and last:
                parts[last] = stem + "*"
    return ".".join(parts)


def _template(name: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """`name` as a format string with a `{}` where each HF expert id and layer number stood, and those numbers'
    (kind, value) in order."""
    spans = sorted(
        (m.start(2), m.end(2), kind) for kind, pattern in _HF_NUMBERS.items() for m in pattern.finditer(name)
    )
    form, fields, at = [], [], 0
    for start, end, kind in spans:
        form.append(name[at:start].replace("{", "{{").replace("}", "}}") + "{}")
        fields.append((kind, int(name[start:end])))
        at = end
    form.append(name[at:].replace("{", "{{").replace("}", "}}"))
    return "".join(form), tuple(fields)


def same_slots(a: dict[str, ProbeSlot], b: dict[str, ProbeSlot]) -> bool:
    """True when both hold the same names, shapes, writers and runs."""
    if set(a) != set(b):
        return False
    for name, x in a.items():
        y = b[name]
        if (x.hf_name, x.shape, x.writer, x.owned) != (y.hf_name, y.shape, y.writer, y.owned):
            return False
        if x.runs.shape != y.runs.shape or not int_views_equal(x.runs, y.runs):
            return False
    return True
