"""Planted weight-sync bugs: senders (`--sender convcheck.mutants.sync:NAME`), receivers (`--receiver ...:CLASS`)
and hooks that patch convcheck.sync in every rank (`--hook ...:NAME`). Each names the tensor it breaks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from convcheck.compare.bits import int_view
from convcheck.mutants.patch import wrap
from convcheck.sync import delta, transport
from convcheck.sync.buckets import Bucket, pack_buckets, unpack_bucket
from convcheck.sync.receivers import FusedReceiver
from convcheck.sync.transport import chunk_bytes

FLIPPED = "model.layers.0.self_attn.k_proj.weight"
"""The tensor flip_bit corrupts (element [0, 5])."""
TRUNCATED = "model.layers.0.mlp.up_proj.weight"
"""The tensor truncate_broadcast_chunk cuts short."""
RAISE_AFTER = 3


# --- senders -------------------------------------------------------------------------------------------------------


def flip_bit(ctx: Any) -> Iterator[tuple[str, Any]]:
    """The bridge's export with the lowest bit of one element of FLIPPED flipped on its way out."""
    for name, tensor in ctx.bridge_export():
        if name == FLIPPED:
            tensor = tensor.clone()
            int_view(tensor)[5] ^= 1
        yield name, tensor


def bucket_offset_off_by_one(ctx: Any) -> Iterator[tuple[str, Any]]:
    """Bucketed, but the metadata offset of the second tensor of the first multi-tensor bucket is one byte late."""
    from dataclasses import replace

    planted = False
    for bucket in pack_buckets(ctx.bridge_export(), chunk_bytes(ctx.sync.chunk_mb)):
        if not planted and len(bucket.entries) > 1:
            entries = list(bucket.entries)
            entries[1] = replace(entries[1], offset=entries[1].offset + 1)
            bucket, planted = Bucket(buffer=bucket.buffer, entries=tuple(entries)), True
        yield from unpack_bucket(bucket)


def duplicate_and_drop(ctx: Any) -> Iterator[tuple[str, Any]]:
    """Sends the first tensor twice and never sends the last one."""
    items = iter(ctx.bridge_export())
    first = next(items)
    yield first
    yield first
    previous = None
    for item in items:
        if previous is not None:
            yield previous
        previous = item


def raises_midway(ctx: Any) -> Iterator[tuple[str, Any]]:
    """Sends RAISE_AFTER tensors, then raises (the rest of the bridge's stream is abandoned on every rank alike)."""
    for count, item in enumerate(ctx.bridge_export()):
        if count == RAISE_AFTER:
            raise ConnectionError("weight channel closed by peer")
        yield item


def yields_non_tensor(ctx: Any) -> Iterator[tuple[str, Any]]:
    """Sends the second tensor as a nested Python list instead of a tensor."""
    for count, (name, tensor) in enumerate(ctx.bridge_export()):
        yield (name, tensor.float().tolist()) if count == 1 else (name, tensor)


def yields_unknown_name(ctx: Any) -> Iterator[tuple[str, Any]]:
    """Sends every tensor, plus one under a name the checkpoint does not have."""
    yield from ctx.bridge_export()
    yield "model.layers.0.self_attn.qkv.weight", torch.zeros(2, 2)


# --- receivers -----------------------------------------------------------------------------------------------------


class DropVReceiver(FusedReceiver):
    """A fused receiver whose loader skips every v_proj piece of qkv_proj (those rows keep the NaN fill)."""

    def load_weights(self, weights: Any) -> None:
        super().load_weights((n, t) for n, t in weights if ".v_proj." not in n)


class SwapGateUpReceiver(FusedReceiver):
    """A fused receiver that loads gate_proj into the up rows of gate_up_proj and up_proj into the gate rows."""

    def load_weights(self, weights: Any) -> None:
        swap = {".gate_proj.": ".up_proj.", ".up_proj.": ".gate_proj."}

        def renamed(name: str) -> str:
            if ".experts." in name:
                return name
            for a, b in swap.items():
                if a in name:
                    return name.replace(a, b)
            return name

        super().load_weights((renamed(n), t) for n, t in weights)


class TransposeOnReloadReceiver(FusedReceiver):
    """A fused receiver that stores o_proj transposed whenever it already holds it (a second sync transposes)."""

    def load_weights(self, weights: Any) -> None:
        def items() -> Iterator[tuple[str, Any]]:
            for name, tensor in weights:
                if name.endswith("o_proj.weight") and name in self.params:
                    self.params[name] = tensor.detach().t().contiguous()
                    continue
                yield name, tensor

        super().load_weights(items())


class AccumulateOnReloadReceiver(FusedReceiver):
    """A fused receiver that adds norm weights onto what it holds instead of overwriting them."""

    def load_weights(self, weights: Any) -> None:
        def items() -> Iterator[tuple[str, Any]]:
            for name, tensor in weights:
                if name.endswith("norm.weight") and name in self.params:
                    self.params[name].add_(tensor)
                    continue
                yield name, tensor

        super().load_weights(items())


class NoLoadWeights:
    """Bad input: a receiver class without load_weights."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def state_dict(self) -> dict[str, Any]:
        return {}


# --- hooks (run in every rank before the model is built) -----------------------------------------------------------


def truncate_broadcast_chunk() -> None:
    """The chunked broadcast cuts the last chunk of the first up_proj it sends (TRUNCATED on a dense model, an
    expert's on a MoE) two bytes short."""
    hit: list[str] = []

    def make(original: Any) -> Any:
        def payload(name: str, tensor: Any) -> Any:
            raw = original(name, tensor)
            if name.endswith("up_proj.weight") and hit in ([], [name]):
                hit[:] = [name]
                return raw[:-2]
            return raw

        return payload

    wrap(transport, "payload", make)


def delta_index_off_by_one() -> None:
    """The delta builder records the first changed index of the first patched tensor one element late."""
    from dataclasses import replace

    def make(original: Any) -> Any:
        def build_delta(previous: Any, new: Any) -> Any:
            built = original(previous, new)
            entries = list(built.entries)
            for i, entry in enumerate(entries):
                if entry.op == delta.PATCH and entry.indices.numel():
                    indices = entry.indices.clone()
                    last = 1
                    for d in entry.shape:
                        last *= d
                    indices[0] += 1 if int(indices[0]) + 1 < last else -1
                    entries[i] = replace(entry, indices=indices)
                    break
            return delta.Delta(tuple(entries))

        return build_delta

    wrap(delta, "build_delta", make)


def empty_delta_not_noop() -> None:
    """Applying an empty delta clears the first element of the first tensor (a stale write buffer)."""

    def make(original: Any) -> Any:
        def apply_delta(state: Any, built: Any) -> Any:
            out = original(state, built)
            if not built.entries and out:
                name = min(out)
                out[name] = out[name].clone()
                out[name].reshape(-1)[0] = 0
            return out

        return apply_delta

    wrap(delta, "apply_delta", make)
