"""NameIndex: the global Megatron names of one rank's parameters and persistent buffers, computed once per name.

Coverage, the shard taps, the mapping oracle, the registry and the gate manifest all ask for a parameter's global
name (layer and expert numbers made global) and for the rank's (virtual stage, local name, global name, tensor) list.
One index per model chunks answers both: the names are kept while the chunks live (a trainer's later live checks do
not compute them again), the walk of the modules once per run. The bridge's naming function
(`model_bridge._megatron_local_name_to_global`) is looked up at every call: a trainer or a planted bug may patch it,
and a patched (or reloaded) function starts the names afresh.
"""

from __future__ import annotations

import weakref
from typing import Callable

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion import model_bridge
from megatron.core.transformer.module import MegatronModule

from convcheck.layout import RankCoord
from convcheck.rank.model import named_tensors

LocalTensor = tuple[int, str, str, torch.Tensor]
"""(virtual stage, local name, global name, tensor) of one parameter or persistent buffer."""

_KEPT: weakref.WeakKeyDictionary[MegatronModule, NameIndex] = weakref.WeakKeyDictionary()
"""First model chunk -> the process's index of those chunks (it holds the chunks only weakly)."""


class NameIndex:
    """Global names of these very chunks at these coordinates ((local name, virtual stage) -> global name), as the
    bridge's current naming function gives them, and the run's walk of their tensors."""

    def __init__(self, chunks: list[MegatronModule], coord: RankCoord) -> None:
        self._chunks = tuple(weakref.ref(c) for c in chunks)
        self.coord = coord
        self._namer: Callable[..., str] | None = None
        self._names: dict[tuple[str, int], str] = {}
        self._walk: list[LocalTensor] | None = None

    @classmethod
    def of(cls, chunks: list[MegatronModule], coord: RankCoord) -> NameIndex:
        """The process's index of `chunks` at `coord` (a new one for other chunks or coordinates), for a new run: its
        names are kept, its walk of the tensors is made again at the first `local_tensors`."""
        kept = _KEPT.get(chunks[0]) if chunks else None
        if kept is None or kept.coord != coord or not kept._same(chunks):
            kept = cls(chunks, coord)
            if chunks:
                _KEPT[chunks[0]] = kept
        kept._walk = None
        return kept

    def end_run(self) -> None:
        """Let go of the run's walk (it holds the tensors): what a live check does as it returns."""
        self._walk = None

    def _same(self, chunks: list[MegatronModule]) -> bool:
        """True when the index's chunks are these very objects, in order."""
        return len(self._chunks) == len(chunks) and all(r() is c for r, c in zip(self._chunks, chunks))

    def _current(self) -> Callable[..., str]:
        """The bridge's naming function now; a different one than the names were made with forgets them."""
        namer = model_bridge._megatron_local_name_to_global  # looked up now: a planted bug or a trainer may patch it
        if namer is not self._namer:
            self._namer, self._names, self._walk = namer, {}, None
        return namer

    def _live_chunks(self) -> list[MegatronModule]:
        chunks = [r() for r in self._chunks]
        if any(c is None for c in chunks):
            raise RuntimeError("NameIndex: its model chunks are gone")
        return chunks  # type: ignore[return-value]

    def global_name(self, local_name: str, vp_stage: int) -> str:
        """Megatron's global name of the parameter `local_name` of virtual stage `vp_stage`."""
        namer = self._current()
        found = self._names.get((local_name, vp_stage))
        if found is None:
            chunks = self._live_chunks()
            found = self._names[(local_name, vp_stage)] = namer(chunks, chunks[0].config, local_name, vp_stage)
        return found

    def local_tensors(self) -> list[LocalTensor]:
        """(virtual stage, local name, global name, tensor) for every parameter and persistent buffer of the chunks,
        walked once per run (and again when the naming function changes)."""
        self._current()
        if self._walk is None:
            walk = [(vp, local, self.global_name(local, vp), t) for vp, local, t in named_tensors(self._live_chunks())]
            self._walk = walk
        return self._walk
