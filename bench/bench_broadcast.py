"""Benchmark: the broadcast oracle's chunked transport against one plain torch.distributed.broadcast of the same
bytes, 2 ranks on this machine (gloo; `--device cuda`: NCCL on 2 GPUs); prints one JSON line.

    python bench/bench_broadcast.py [--mib 128] [--tensors 8] [--chunk-mb 64] [--repeat 5] [--device cpu|cuda]

The bytes start on the sender's CPU and end on the receiver's CPU on both paths (as in the oracle). Each trial
starts at a barrier and ends when the slower rank holds every byte; trials alternate between the two paths and the
best of `--repeat` counts. `ratio` is the chunked transport's effective bandwidth over the plain broadcast's
(goal: >= 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trial(fn) -> float:  # type: ignore[no-untyped-def]
    """Seconds from a barrier until the slower rank is done."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    mine = time.perf_counter() - t0
    both: list[float] = [0.0, 0.0]
    dist.all_gather_object(both, mine)
    return max(both)


def _worker(rank: int, port: int, args: argparse.Namespace, out: dict) -> None:  # type: ignore[type-arg]
    from convcheck.compare.bits import bytes_equal
    from convcheck.sync.transport import Channel, chunk_bytes, sync_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=2)
    per = int(args.mib * 2**20) // args.tensors // 2
    gen = torch.Generator().manual_seed(0)
    bits = [torch.randint(-(2**15), 2**15 - 1, (per,), dtype=torch.int16, generator=gen) for _ in range(args.tensors)]
    tensors = [b.view(torch.bfloat16) for b in bits]
    flat = torch.cat([t.view(torch.uint8) for t in tensors])
    if rank != 0:
        flat = torch.empty_like(flat)
    group = sync_group()
    received: list = []  # type: ignore[type-arg]

    def plain() -> None:  # the receiver needs somewhere to put the bytes, as the chunked receiver does
        wire = flat if rank == 0 else torch.empty_like(flat)
        wire = wire.to(args.device) if args.device != "cpu" else wire
        dist.broadcast(wire, 0, group)
        wire.cpu()

    def chunked() -> None:
        channel = Channel(group, 0, chunk_bytes(args.chunk_mb), device=args.device)
        if rank == 0:
            for i, t in enumerate(tensors):
                channel.send(f"t{i}", t)
            channel.close()
        else:
            received.clear()
            while (item := channel.recv()) is not None:
                received.append(item.tensor())

    times: dict[str, list[float]] = {"plain": [], "chunked": []}
    for _ in range(args.repeat):  # interleaved, so load from elsewhere on the machine hits both alike
        times["plain"].append(_trial(plain))
        times["chunked"].append(_trial(chunked))
    t_plain, t_chunked = min(times["plain"]), min(times["chunked"])
    if rank == 1:
        out["intact"] = len(received) == len(tensors) and all(bytes_equal(a, b) for a, b in zip(tensors, received))
    if rank == 0:
        nbytes = flat.numel()
        out.update(bytes=nbytes, plain_s=t_plain, chunked_s=t_chunked)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=128)
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--chunk-mb", type=float, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(_free_port(), args, out), nprocs=2, join=True)
        result = dict(out)
    nbytes = result["bytes"]
    plain_bw, chunked_bw = nbytes / result["plain_s"], nbytes / result["chunked_s"]
    print(json.dumps({
        "bench": "broadcast",
        "backend": "nccl" if args.device == "cuda" else "gloo",
        "ranks": 2,
        "bytes": nbytes,
        "tensors": args.tensors,
        "chunk_mb": args.chunk_mb,
        "plain_GBps": round(plain_bw / 1e9, 3),
        "chunked_GBps": round(chunked_bw / 1e9, 3),
        "ratio_chunked_vs_plain": round(chunked_bw / plain_bw, 3),
        "intact": result["intact"],
        "torch": torch.__version__,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
