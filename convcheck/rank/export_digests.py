"""An export tap that hashes (rank 0) every tensor of the first export stream drained to its end: the live
`convcheck-digest/1` manifest of a job's export (convcheck.live.digest)."""

from __future__ import annotations

from typing import Any

from convcheck.compare.hashpool import HashPool
from convcheck.hf.checkpoint import _TORCH_NAMES
from convcheck.hf.digest import HASH, DigestEntry, Manifest

SAFETENSORS_NAMES = {torch_name: st for st, torch_name in _TORCH_NAMES.items()}
"""torch dtype name -> the safetensors dtype name a manifest records."""


class ExportDigests:
    """An export consumer (`start()` / `consume(name, tensor)` / `finish(export_error)`, convcheck.rank.export_pass);
    only the first
    stream that runs to its end is kept, and only on the reporting rank."""

    def __init__(self, *, reporter: bool, by: str = "") -> None:
        self.reporter = reporter
        self.by = by
        self.finished = False
        self.error: str | None = None
        self._pool: HashPool | None = None
        self._order: list[tuple[str, str, tuple[int, ...]]] = []
        self._shas: dict[int, str] = {}

    def start(self) -> None:
        if self.finished or not self.reporter:
            return
        self.close()
        self._pool, self._order = HashPool(), []

    def consume(self, name: str, tensor: Any) -> None:
        if self._pool is None:
            return
        self._order.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)))
        self._pool.submit(len(self._order) - 1, tensor)

    def finish(self, export_error: str | None) -> None:
        if self.finished:
            return
        self.finished, self.error = True, export_error
        if self._pool is not None:
            pool, self._pool = self._pool, None
            self._shas = pool.results()  # type: ignore[assignment]

    def close(self) -> None:
        """Stop the hashing threads of a stream that never finished (an oracle raised inside it)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.results()

    def manifest(self) -> Manifest:
        """The `convcheck-digest/1` manifest of the stream (the last yield of a name repeated by the export)."""
        entries = {}
        for i, (name, dtype, shape) in enumerate(self._order):
            entries[name] = DigestEntry(dtype=SAFETENSORS_NAMES.get(dtype, dtype), shape=shape, digest=self._shas[i])
        return Manifest(path=None, hash=HASH, tensors=entries)
