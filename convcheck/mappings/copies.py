"""A mapping whose HF tensors a checkpoint also holds under other names: DeepSeek-V3's MTP layer k keeps copies of
model.embed_tokens and lm_head as model.layers.{L + k}.embed_tokens / shared_head.head, which no Megatron parameter
holds (the MTP block uses the model's own embedding and output layer)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import MappingError, RankCoord, Shards, TensorMapping


@dataclass(frozen=True, kw_only=True, slots=True)
class WithCopies:
    """`inner`, whose every rebuilt HF tensor `source` is also produced, bitwise the same, as each of its copies."""

    inner: TensorMapping
    copies: tuple[tuple[str, str], ...]
    """(copy's HF name, the HF name of `inner`'s tensor it repeats)."""

    def __post_init__(self) -> None:
        unknown = sorted({source for _, source in self.copies} - set(self.inner.hf_names))
        if unknown:
            raise MappingError(f"{self.inner.megatron}: copies of {unknown}, which it does not produce")

    @property
    def megatron(self) -> str:
        return self.inner.megatron

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (*self.inner.hf_names, *(copy for copy, _ in self.copies))

    def canonical(self, coord: RankCoord) -> RankCoord:
        return self.inner.canonical(coord)

    def coords(self, layout: ParallelLayout) -> list[RankCoord]:
        return self.inner.coords(layout)

    def to_shard(self, hf: Mapping[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
        """`inner`'s shard (built from the source tensors, never from the copies)."""
        return self.inner.to_shard(hf, layout, coord)

    def from_shards(self, shards: Shards, layout: ParallelLayout) -> Iterator[tuple[str, Any]]:
        """`inner`'s HF tensors, each followed by its copies."""
        for name, tensor in self.inner.from_shards(shards, layout):
            yield name, tensor
            for copy, source in self.copies:
                if source == name:
                    yield copy, tensor


def with_copies(inner: TensorMapping, copies: tuple[tuple[str, str], ...]) -> TensorMapping:
    """`inner` itself when there are no copies, else WithCopies."""
    return WithCopies(inner=inner, copies=copies) if copies else inner
