"""Byte ranges one comparison proved equal, so a second check of the very same ranges need not read them again.

A fact names two contiguous tensors' memory (device, data pointer, byte count) and is kept with both tensors and
their version counters: while it is held neither memory can be freed and reused, and an in-place write to either
tensor (or a view of it) moves its counter, which makes the fact unknown again. Facts live for one export step
(`clear`): the differential notes what its compare of a task's real output with the rank's shard proved, the mapping
tap looks the same ranges up as that output streams by (convcheck.live).
"""

from __future__ import annotations

from typing import Any

_Key = tuple[Any, int, int, int]


class ProvenBytes:
    """Equal byte ranges of held tensors, looked up by (device, pointer, pointer, bytes) in either order."""

    __slots__ = ("_facts", "hits")

    def __init__(self) -> None:
        self._facts: dict[_Key, tuple[Any, int, Any, int]] = {}
        self.hits = 0

    def note(self, a: Any, a_start: int, b: Any, b_start: int, count: int) -> None:
        """Record that elements [a_start, a_start + count) of contiguous `a` equal [b_start, b_start + count) of
        contiguous `b` bitwise (one element width); tensors that are not contiguous are not recorded."""
        width = a.element_size()
        if count <= 0 or width != b.element_size() or not (a.is_contiguous() and b.is_contiguous()):
            return
        pa, pb = a.data_ptr() + a_start * width, b.data_ptr() + b_start * width
        held = (a, a._version, b, b._version)
        self._facts[(a.device, pa, pb, count * width)] = held
        self._facts[(a.device, pb, pa, count * width)] = held

    def known(self, x: Any, y: Any) -> bool:
        """True when the whole of contiguous `x` and of `y` (same byte count, one device) are a noted equal pair
        whose tensors have not been written since."""
        if x.device != y.device or not (x.is_contiguous() and y.is_contiguous()):
            return False
        nbytes = x.numel() * x.element_size()
        if nbytes != y.numel() * y.element_size():
            return False
        held = self._facts.get((x.device, x.data_ptr(), y.data_ptr(), nbytes))
        if held is None or held[0]._version != held[1] or held[2]._version != held[3]:
            return False
        self.hits += 1
        return True

    def clear(self) -> None:
        """Forget every fact (and let go of the tensors they held)."""
        self._facts.clear()
