"""Built-in senders beside the bridge's export: `bucketed` (flat byte buckets) and `broadcast` (chunked broadcast).

A sender is called collectively in every rank as FUNC(ctx) and returns an iterator of (hf_name, tensor); the
fields of `ctx` a sender may rely on are listed in README ("Weight-sync paths").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from convcheck.sync.buckets import pack_buckets, unpack_bucket
from convcheck.sync.transport import Channel, chunk_bytes, sync_group


def bucketed(ctx: Any) -> Iterator[tuple[str, Any]]:
    """The bridge's export packed into buckets of at most --chunk-mb and unpacked again, as RL stacks ship updates."""
    for bucket in pack_buckets(ctx.bridge_export(), chunk_bytes(ctx.sync.chunk_mb)):
        yield from unpack_bucket(bucket)


def broadcast(ctx: Any) -> Iterator[tuple[str, Any]]:
    """The last rank broadcasts its bridge export in chunks of --chunk-mb over a group of its own; every other rank
    (rank 0 included, where the HF-keyed oracles compare) yields what it reassembled, the last rank its own copy.

    Every rank drains its own bridge export in step (it runs the bridge's collectives); a received tensor whose
    bytes fall short of its header's shape is yielded as the raw bytes that arrived.
    """
    if ctx.world < 2:
        yield from ctx.bridge_export()
        return
    src = ctx.world - 1
    channel = Channel(sync_group(), src, chunk_bytes(ctx.sync.chunk_mb), device=ctx.device)
    ended = False
    for name, tensor in ctx.bridge_export():
        if ctx.rank == src:
            channel.send(name, tensor)
            yield name, tensor
        elif not ended:
            received = channel.recv()
            if received is None:
                ended = True
            else:
                yield received.name, received.tensor()
    if ctx.rank == src:
        channel.close()
        return
    while not ended:
        received = channel.recv()
        if received is None:
            break
        yield received.name, received.tensor()
