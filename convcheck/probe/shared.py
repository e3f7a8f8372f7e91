"""Probe slots shared by tasks that run the same code on shards of one geometry: the routed experts of one layer
(their mappings differ only in their expert number), and the same parameter of successive decoder layers (their
mappings differ only in their layer number). The first of a kind is probed, the second is probed and must equal the
first's slots with the expert (or layer) ids of its HF names moved by the difference of their numbers, and the rest
take those renamed slots. Every task's real output is still compared bitwise against its own weight, so only the
probe run is shared; without real outputs to check (the elements oracle's probe alone) every task is probed
(convcheck.probe.collect).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from convcheck.compare.bits import int_views_equal
from convcheck.probe.run import ProbeSlot
from convcheck.probe.stubs import EXPERT_ID as HF_EXPERT

MEGATRON_EXPERT = re.compile(r"local_experts\.(\d+)\.|\.(?:weight|bias)(\d+)$")
"""The expert number in a Megatron expert parameter name (SequentialMLP's local_experts.N, TEGroupedMLP's weightN)."""
LAYER = re.compile(r"((?:^|\.)layers\.)(\d+)(?=\.)")
"""A layer number in a Megatron or HF name (`decoder.layers.N.`, `model.layers.N.`, `mtp.layers.N.`)."""


@dataclass
class _Entry:
    number: int
    slots: dict[str, ProbeSlot]
    ids: re.Pattern[str]
    """Where the numbers the slots' HF names are renamed by sit (HF_EXPERT or LAYER)."""
    state: str = "unconfirmed"
    """'unconfirmed' until a second expert is probed; then 'shared' (it matched) or 'off' (every task probes)."""


class SharedProbes:
    """One check's shared expert probes, keyed by everything the probe run reads but the expert number."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], _Entry] = {}
        self.shared = 0
        """Tasks that took renamed slots instead of a probe run."""

    def slots(self, task: Any, rank: int, probe: Callable[[], dict[str, ProbeSlot]]) -> dict[str, ProbeSlot]:
        """The task's probe slots: `probe()` for the first two experts of a key (the second checked against the
        first, renamed), renamed slots for the later ones; `probe()` whenever the task is not a routed expert."""
        key, number, ids = expert_key(task, rank), expert_number(task), HF_EXPERT
        if key is None:
            key, number, ids = layer_key(task, rank), layer_number(task), LAYER
        if key is None:
            return probe()
        entry = self._entries.get(key)
        if entry is None:
            found = probe()
            self._entries[key] = _Entry(number=number, slots=found, ids=ids)
            return found
        if entry.state == "off":
            return probe()
        renamed = renamed_slots(entry.slots, number - entry.number, ids)
        if entry.state == "unconfirmed":
            found = probe()
            entry.state = "shared" if same_slots(found, renamed) else "off"
            return found
        self.shared += 1
        return renamed


def expert_number(task: Any) -> int:
    """The expert number in the task's Megatron parameter name (-1 when it has none)."""
    found = MEGATRON_EXPERT.search(str(getattr(task.mapping, "megatron_param", "") or task.param_name))
    if found is None:
        return -1
    return int(found.group(1) if found.group(1) is not None else found.group(2))


def expert_key(task: Any, rank: int) -> tuple[Any, ...] | None:
    """What the probe run of a routed-expert task reads, its expert number hidden: the mapping's class (and its
    delegate's), its name strings, the weight's geometry and TP attributes, the module's class and config; None for
    any other task."""
    mapping, weight = task.mapping, task.param_weight
    if weight is None or not getattr(mapping, "is_expert", False) or expert_number(task) < 0:
        return None
    return _reads(task, rank, _hidden)


def layer_number(task: Any) -> int:
    """The first layer number in the task's Megatron parameter name (-1 when it has none)."""
    found = LAYER.search(str(getattr(task.mapping, "megatron_param", "") or task.param_name))
    return -1 if found is None else int(found.group(2))


def layer_key(task: Any, rank: int) -> tuple[Any, ...] | None:
    """What the probe run of a layer's non-expert task reads, its layer number hidden: as expert_key (the mapping's
    classes, its name strings, the weight's geometry and TP attributes, the module's class and config); None for a
    routed expert or a task of no layer."""
    mapping, weight = task.mapping, task.param_weight
    if weight is None or getattr(mapping, "is_expert", False) or layer_number(task) < 0:
        return None
    return ("layer", *_reads(task, rank, lambda names: _hidden(names, LAYER)))


def _reads(task: Any, rank: int, hide: Callable[[Any], Any]) -> tuple[Any, ...]:
    """The rank, the mapping's and its delegate's classes, its names through `hide`, the weight's geometry and TP
    attributes, the module's class and config object."""
    mapping, weight, module = task.mapping, task.param_weight, task.megatron_module
    attrs = tuple(getattr(weight, a, None) for a in ("tensor_model_parallel", "partition_dim", "partition_stride"))
    delegate = getattr(mapping, "_mapping", None)
    return (
        rank, type(mapping), type(delegate), hide(getattr(mapping, "megatron_param", None)),
        hide(getattr(mapping, "hf_param", None)),
        tuple(weight.shape), weight.dtype, tuple(weight.stride()), weight.device, attrs,
        type(module), id(getattr(module, "config", None)),
    )  # fmt: skip


def _hidden(names: Any, ids: re.Pattern[str] | None = None) -> Any:
    """A mapping's name (or dict of names) with its expert numbers hidden (or the numbers `ids` finds)."""
    if isinstance(names, dict):
        return tuple(sorted((str(k), _hidden(v, ids)) for k, v in names.items()))
    if isinstance(names, str):
        if ids is not None:
            return ids.sub(r"\1*", names)
        return HF_EXPERT.sub(r"\1*", MEGATRON_EXPERT.sub("*", names))
    return repr(names)


def renamed_slots(slots: dict[str, ProbeSlot], shift: int, ids: re.Pattern[str] = HF_EXPERT) -> dict[str, ProbeSlot]:
    """`slots` with every expert id (or every number `ids` finds: group 1 its prefix, group 2 the number) of their HF
    names moved by `shift`."""

    def rename(name: str) -> str:
        return ids.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + shift}", name)

    out = {}
    for slot in slots.values():
        name = rename(slot.hf_name)
        out[name] = ProbeSlot(hf_name=name, shape=slot.shape, runs=slot.runs, writer=slot.writer, owned=slot.owned)
    return out


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
