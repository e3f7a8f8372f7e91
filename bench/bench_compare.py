"""Benchmark: the roundtrip oracle's byte compare against a plain copy of the same bytes; prints JSON.

    python bench/bench_compare.py [--device cpu|cuda] [--gib 1.0] [--repeat 5]

The copy (read + write of N bytes) is the memory-bandwidth limit; a compare reads 2N bytes. `ratio` is the
compare's throughput over the copy's, both counted as bytes moved.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from convcheck.compare.bits import bytes_equal, int_view


def _timed(fn, repeat: int, sync) -> float:  # type: ignore[no-untyped-def]
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gib", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = int(args.gib * 2**30) // 2
    a = torch.randint(-(2**15), 2**15 - 1, (n,), dtype=torch.int16, device=args.device).view(torch.bfloat16)
    b = a.clone()
    out = torch.empty_like(a)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    nbytes = a.numel() * a.element_size()
    t_copy = _timed(lambda: out.copy_(a), args.repeat, sync)
    t_fast = _timed(lambda: bytes_equal(a, b), args.repeat, sync)
    t_naive = _timed(lambda: bool((int_view(a) != int_view(b)).any()), args.repeat, sync)
    copy_bw = 2 * nbytes / t_copy
    result = {
        "bench": "compare",
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "bytes": nbytes,
        "copy_GBps": round(copy_bw / 1e9, 1),
        "bytes_equal_GBps": round(2 * nbytes / t_fast / 1e9, 1),
        "naive_ne_any_GBps": round(2 * nbytes / t_naive / 1e9, 1),
        "ratio_bytes_equal_vs_copy": round((2 * nbytes / t_fast) / copy_bw, 3),
        "ratio_naive_vs_copy": round((2 * nbytes / t_naive) / copy_bw, 3),
        "torch": torch.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
