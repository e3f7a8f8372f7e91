"""Class-level state of mapping classes, kept apart for the probe's runs.

A mapping class may hold a mutable container for all its instances and carry values through it from one task to
another: ERNIE 4.5 VL's `_ConcatBiasMapping._export_buffer` holds the text router's expert bias until the vision
router's task stacks both into one HF tensor (ernie45_vl_bridge.py:284-359). A probe run of such a task must not
write into the real container (the next real conversion would read the probe's codes), and its output holds
elements of another task's shard, which the probe's codes cannot tell apart from its own. `ClassState` swaps a
scratch copy of each container in for a probe run, keeps the scratch between runs of one collection (so the
probe's own runs see each other's writes, as the real ones do), and says which containers a run changed: such a
task carries values between tasks and its probe is not evidence (convcheck.probe.collect reports it not covered).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

_CONTAINERS = (dict, list, set)


class CarriesState(Exception):
    """A task's mapping carries values to or from another task through class-level state."""


class ClassState:
    """The scratch copies of mapping classes' containers for one collection's probe runs."""

    def __init__(self) -> None:
        self._scratch: dict[tuple[type, str], Any] = {}
        self._of_class: dict[type, list[tuple[type, str]]] = {}

    @contextlib.contextmanager
    def isolated(self, mappings: list[Any]) -> Iterator[list[str]]:
        """Scratch copies of the class-level containers of `mappings`' classes swapped in while the block runs;
        the yielded list is filled on exit with `Class.attr` of each container the block changed."""
        changed: list[str] = []
        swapped = []
        for cls, name in self._containers(mappings):
            real = vars(cls)[name]
            scratch = self._scratch.get((cls, name))
            if scratch is None:
                scratch = self._scratch[(cls, name)] = copy.copy(real)
            swapped.append((cls, name, real, scratch, fingerprint(scratch)))
            setattr(cls, name, scratch)
        try:
            yield changed
        finally:
            for cls, name, real, scratch, before in swapped:
                setattr(cls, name, real)
                if fingerprint(scratch) != before:
                    changed.append(f"{cls.__name__}.{name}")

    def _containers(self, mappings: list[Any]) -> list[tuple[type, str]]:
        """containers() of each mapping's class, looked up once per class."""
        found: dict[tuple[type, str], None] = {}
        for mapping in mappings:
            held = self._of_class.get(type(mapping))
            if held is None:
                held = self._of_class[type(mapping)] = containers(type(mapping))
            found.update(dict.fromkeys(held))
        return list(found)


def containers(cls: type) -> list[tuple[type, str]]:
    """(class, attribute) of every dict, list or set `cls` or a base of it defines in its own namespace (`object`
    and dunders not)."""
    return [
        (owner, name)
        for owner in cls.__mro__[:-1]
        for name, value in vars(owner).items()
        if type(value) in _CONTAINERS and not name.startswith("__")
    ]


def fingerprint(container: Any) -> tuple[Any, ...]:
    """What a write into `container` changes: its keys and the identity of each value (items for a set)."""
    if isinstance(container, dict):
        return tuple((key, id(value)) for key, value in container.items())
    if isinstance(container, list):
        return tuple(map(id, container))
    return tuple(sorted(map(repr, container)))
