"""Benchmark: `sweep` and `digest` against a raw sequential read of the same files; prints one JSON line.

    python bench/bench_sweep.py [--gib 2.0] [--small-gib 0.5] [--dir FOLDER] [--repeat 2] [--workers N]

Builds bf16 checkpoints (shards of ~512 MiB with an index; 64 MiB and 4 MiB tensors) in a temporary folder, or takes
--dir, copies it, warms the page cache, and times `cat FILES > /dev/null` (best of 3). Each measurement runs in a fresh
child process that reports its wall time and peak RSS (VmHWM). `ratio_*` is raw-read seconds of the same files over
the measured seconds (1.0: as fast as cat). Everything built is deleted at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
HASHES = ("sha256", "sha1", "blake2b", "sha512", "md5", "blake2s", "sha3_256")


def build(folder: Path, gib: float, seed: int = 0) -> None:
    """bf16 layers of one 64 MiB and four 4 MiB tensors, in ~512 MiB shards listed by an index."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    layers = max(1, round(gib * 1024 / 80))
    per_shard = 6
    weight_map: dict[str, str] = {}
    shards = (layers + per_shard - 1) // per_shard
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for layer in range(s * per_shard, min(layers, (s + 1) * per_shard)):
            sizes = {"mlp.down_proj.weight": (8192, 4096)}
            sizes |= {f"self_attn.{p}_proj.weight": (1024, 2048) for p in "qkvo"}
            for name, shape in sizes.items():
                raw = np.frombuffer(bytearray(rng.bytes(2 * shape[0] * shape[1])), dtype=np.int16).reshape(shape)
                tensors[f"model.layers.{layer}.{name}"] = torch.from_numpy(raw).view(torch.bfloat16)
        save_file(tensors, str(folder / fname))
        weight_map |= dict.fromkeys(tensors, fname)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def files(*folders: Path) -> list[str]:
    return [str(p) for f in folders for p in sorted(f.glob("*.safetensors"))]


def raw_read(paths: list[str]) -> float:
    """Best of 3: `cat FILES > /dev/null` from the (warm) page cache."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
        best = min(best, time.perf_counter() - t0)
    return best


def child(mode: str, a: str, b: str, workers: int) -> None:
    """In a fresh process: one sweep or digest; print seconds and peak RSS (this process only)."""
    from convcheck.hf.digest import write_digest
    from convcheck.hf.sweep import compare, open_side

    base = _hwm_mb()
    t0 = time.perf_counter()
    if mode == "sweep":
        result = compare(open_side(a), open_side(b), workers=workers or None)
        verdict = result.verdict
    else:
        write_digest(a, b, workers=workers or None)
        verdict = "written"
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "hwm_MB": _hwm_mb(), "base_hwm_MB": base, "verdict": verdict}))


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return -1.0


def measure(mode: str, a: Path, b: Path, repeat: int, workers: int) -> dict[str, float | str]:
    """Best seconds and highest peak RSS over `repeat` fresh child processes."""
    runs = []
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for _ in range(repeat):
        cmd = [sys.executable, __file__, "--child", mode, str(a), str(b), "--workers", str(workers)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "seconds": round(min(r["seconds"] for r in runs), 3),
        "peak_rss_MB": max(r["hwm_MB"] for r in runs),
        "rss_before_MB": max(r["base_hwm_MB"] for r in runs),
        "verdict": runs[-1]["verdict"],
    }


def hash_speeds(folder: Path, limit: int = 1 << 30) -> dict[str, float]:
    """MB/s of each stdlib hash (one thread) over the first `limit` bytes of tensors, read window by window."""
    from convcheck.hf.checkpoint import mapped_windows, open_weights

    weights = open_weights(folder)
    names, total = [], 0
    for name in sorted(weights.tensors, key=lambda n: (weights.tensors[n].file, weights.tensors[n].offset)):
        if total >= limit:
            break
        names.append(name)
        total += weights.tensors[name].nbytes
    speeds = {}
    for algo in (*HASHES, "crc32"):
        t0 = time.perf_counter()
        for name in names:
            state = hashlib.new(algo) if algo != "crc32" else None
            crc = 0
            for window in mapped_windows(weights, name):
                if state is None:
                    crc = zlib.crc32(window, crc)
                else:
                    state.update(window)
                del window
        speeds[algo] = round(total / (time.perf_counter() - t0) / 1e6)
    return {"bytes": total, **speeds}


def one_size(work: Path, gib: float | None, given: Path | None, repeat: int, workers: int) -> dict[str, object]:
    """Build (or take) one checkpoint, copy it, and measure raw reads, sweeps and digests on it."""
    from convcheck.hf.checkpoint import open_weights

    a = given or work / f"a-{gib}"
    if given is None:
        t0 = time.perf_counter()
        build(a, gib)  # type: ignore[arg-type]
        build_s = time.perf_counter() - t0
    else:
        build_s = 0.0
    b = work / f"copy-{a.name}"
    shutil.copytree(a, b)
    weights = open_weights(a)
    nbytes = sum(e.nbytes for e in weights.tensors.values())
    largest = max(e.nbytes for e in weights.tensors.values())
    for path in files(a, b):  # warm the page cache
        subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
    read_a, read_ab = raw_read(files(a)), raw_read(files(a, b))
    manifest_b = work / f"{a.name}.copy.digest.json"
    digest = measure("digest", b, manifest_b, repeat, workers)
    folder_folder = measure("sweep", a, b, repeat, workers)
    folder_digest = measure("sweep", a, manifest_b, repeat, workers)
    t0 = time.perf_counter()
    cli_cmd = [sys.executable, "-m", "convcheck", "sweep", str(a), str(b), "--quiet"]
    cli = subprocess.run(cli_cmd, check=False, cwd=ROOT, capture_output=True)
    cli_s = time.perf_counter() - t0
    shutil.rmtree(b)
    bound = 2 * largest / MiB + 300
    peaks = [m["peak_rss_MB"] for m in (digest, folder_folder, folder_digest)]
    return {
        "tensors": len(weights.tensors),
        "bytes": nbytes,
        "largest_tensor_MB": round(largest / MiB, 1),
        "build_s": round(build_s, 1),
        "raw_read": {"seconds": round(read_a, 3), "GBps": round(nbytes / read_a / 1e9, 2)},
        "raw_read_both": {"seconds": round(read_ab, 3), "GBps": round(2 * nbytes / read_ab / 1e9, 2)},
        "sweep_folder_vs_folder": {
            **folder_folder,
            "GBps_read": round(2 * nbytes / float(folder_folder["seconds"]) / 1e9, 2),
            "ratio_to_raw_read": round(read_ab / float(folder_folder["seconds"]), 3),
        },
        "sweep_folder_vs_digest": {
            **folder_digest,
            "GBps_read": round(nbytes / float(folder_digest["seconds"]) / 1e9, 2),
            "ratio_to_raw_read": round(read_a / float(folder_digest["seconds"]), 3),
        },
        "digest": {
            **digest,
            "GBps_read": round(nbytes / float(digest["seconds"]) / 1e9, 2),
            "ratio_to_raw_read": round(read_a / float(digest["seconds"]), 3),
        },
        "cli_sweep_folder_vs_folder": {"seconds": round(cli_s, 3), "exit": cli.returncode},
        "rss_bound_MB": round(bound),
        "rss_within_bound": max(peaks) <= bound,
        "_a": str(a),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2.0, help="Size of the large checkpoint (GiB).")
    parser.add_argument("--small-gib", type=float, default=0.5, help="Size of the small one (RSS flatness).")
    parser.add_argument("--dir", type=Path, help="Measure this checkpoint folder instead of building (one size).")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="Threads (0: convcheck's default).")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "A", "B"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, workers=args.workers)
        return
    from convcheck.compare.threads import default_threads
    from convcheck.hf.digest import HASH

    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="convcheck-bench-sweep-"))
    try:
        sizes = {}
        if args.dir:
            sizes["given"] = one_size(work, None, args.dir.resolve(), args.repeat, args.workers)
        else:
            for label, gib in (("small", args.small_gib), ("large", args.gib)):
                sizes[label] = one_size(work, gib, None, args.repeat, args.workers)
        hashes = hash_speeds(Path(str(next(iter(sizes.values()))["_a"])) if args.dir else work / f"a-{args.gib}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for size in sizes.values():
        size.pop("_a")
    peaks = {k: max(v[m]["peak_rss_MB"] for m in ("digest", "sweep_folder_vs_folder", "sweep_folder_vs_digest"))
             for k, v in sizes.items()}  # fmt: skip
    result = {
        "bench": "sweep",
        "date": time.strftime("%Y-%m-%d"),
        "cpus": len(os.sched_getaffinity(0)),
        "mem_GiB": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "workers": args.workers or default_threads(),
        "hash": HASH,
        "hash_MBps_one_thread": hashes,
        "sizes": sizes,
        "peak_rss_MB": peaks,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
