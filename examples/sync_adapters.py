"""A weight-sync sender and receiver to copy and adapt; convcheck gates them without trusting them.

    convcheck verify --model tiny:qwen3 --tp 2 --oracle coverage,roundtrip,receiver,idempotence \
        --sender examples/sync_adapters.py:layerwise_sender --receiver examples/sync_adapters.py:DictReceiver

The sender is called in every rank as FUNC(ctx) and yields (hf_name, tensor); `ctx` is convcheck's RankContext
(README, "Weight-sync paths", lists the fields a sender may use). The receiver is built on rank 0 as
CLASS(config=<transformers config of the checkpoint>) and fed with one load_weights call per sync.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch


def _layer(name: str) -> str:
    """`model.layers.3` for a layer's tensors, the name itself for the others."""
    parts = name.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 and parts[1] == "layers" else name


def _ship(group: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Pack one group into a flat byte buffer with a (name, dtype, shape, offset) list, then cut it apart again:
    the two halves of an IPC or NCCL weight update, here in one process."""
    metadata, pieces, offset = [], [], 0
    for name, tensor in group:
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        metadata.append((name, tensor.dtype, tuple(tensor.shape), offset))
        pieces.append(raw)
        offset += raw.numel()
    flat = torch.cat(pieces)
    for name, dtype, shape, start in metadata:
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        yield name, flat[start : start + size].view(dtype).reshape(shape)


def layerwise_sender(ctx: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The bridge's export grouped by decoder layer, each group shipped as one flat buffer."""
    group: list[tuple[str, torch.Tensor]] = []
    for name, tensor in ctx.bridge_export():
        if group and _layer(name) != _layer(group[-1][0]):
            yield from _ship(group)
            group = []
        group.append((name, tensor))
    if group:
        yield from _ship(group)


class DictReceiver:
    """The smallest receiver: keeps every tensor under its HF name, overwriting on a later sync.

    Without an `expected(hf)` method its state must equal the source tensors by name; a receiver that renames or
    packs tensors (see convcheck.sync.receivers.FusedReceiver) returns what it should hold from expected(hf).
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.weights: dict[str, torch.Tensor] = {}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            self.weights[name] = tensor.detach().clone()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.weights)
