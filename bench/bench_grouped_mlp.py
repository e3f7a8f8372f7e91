"""Benchmark: GroupedMLP mapping export (from_shards over every EP x ETP rank's weight1/weight2) memory and time.

    python bench/bench_grouped_mlp.py [--experts 32] [--hidden 2048] [--ffn 768] [--cases 1x1,2x1,4x1,2x2]
    python bench/bench_grouped_mlp.py --qwen3-30b      # 128 experts: Qwen3-30B-A3B's real MoE layer (~3 GB RSS)
    python bench/bench_grouped_mlp.py --keep-outputs   # control: a consumer that keeps the layer is measured so

One subprocess per EP x ETP case (glibc's mmap threshold pinned, so freed tensors leave the RSS); peak memory is
the kernel's RSS high-water mark (`VmHWM`, reset through `/proc/self/clear_refs`) minus the RSS before the step.
Prints one JSON line per case: shard bytes (the input), peak extra bytes during export, one expert's bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HF = "model.layers.0.mlp.experts.{expert}.{proj}.weight"


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_extra(step: Callable[[], Any]) -> tuple[Any, int, float, str]:
    """Run `step`; return its result, peak RSS over the RSS before it (bytes), seconds, and the method used."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        method = "VmHWM after clear_refs"
    except OSError:
        method = "psutil RSS sampled every 1 ms"
    import psutil

    proc = psutil.Process()
    before = proc.memory_info().rss
    high = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.001):
            high[0] = max(high[0], proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    if method.startswith("psutil"):
        sampler.start()
    t0 = time.perf_counter()
    result = step()
    seconds = time.perf_counter() - t0
    done.set()
    if method.startswith("psutil"):
        sampler.join()
        peak = max(high[0], proc.memory_info().rss)
    else:
        peak = _status_kib("VmHWM") * 1024
    return result, peak - before, seconds, method


def _worker(args: argparse.Namespace) -> None:
    import torch

    from convcheck.compare.bits import bytes_equal
    from convcheck.layout import ParallelLayout, RankCoord
    from convcheck.mappings.grouped_mlp import GroupedFc1, GroupedFc2

    dtype = getattr(torch, args.dtype)
    layout = ParallelLayout(ep=args.ep, etp=args.etp)
    dims = {"num_experts": args.experts, "hidden": args.hidden, "ffn": args.ffn}
    fc1 = GroupedFc1(megatron="decoder.layers.0.mlp.experts.weight1", gate=HF.replace("{proj}", "gate_proj"),
                     up=HF.replace("{proj}", "up_proj"), **dims)  # fmt: skip
    fc2 = GroupedFc2(megatron="decoder.layers.0.mlp.experts.weight2", down=HF.replace("{proj}", "down_proj"), **dims)
    gen = torch.Generator().manual_seed(0)
    hf: dict[str, Any] = {}
    for e in range(args.experts):  # one tensor at a time: no float32 temporary of the whole layer
        for proj, shape in (("gate_proj", (args.ffn, args.hidden)), ("up_proj", (args.ffn, args.hidden)),
                            ("down_proj", (args.hidden, args.ffn))):  # fmt: skip
            hf[HF.format(expert=e, proj=proj)] = torch.randn(shape, generator=gen).to(dtype)
    shards: dict[str, dict[RankCoord, Any]] = {fc1.megatron: {}, fc2.megatron: {}}
    import_s, import_extra = [], []
    for coord in fc1.coords(layout):

        def to_shard(coord: RankCoord = coord) -> tuple[Any, Any]:
            return fc1.to_shard(hf, layout, coord), fc2.to_shard(hf, layout, coord)

        (w1, w2), extra, seconds, _ = _peak_extra(to_shard)
        shards[fc1.megatron][coord], shards[fc2.megatron][coord] = w1, w2
        import_s.append(seconds)
        import_extra.append(extra)
    if args.no_verify:
        hf.clear()

    def export() -> tuple[int, bool]:
        count, equal, kept = 0, True, []
        for mapping in (fc1, fc2):
            for name, tensor in mapping.from_shards(shards[mapping.megatron], layout):
                count += 1
                equal = equal and (args.no_verify or bytes_equal(hf[name], tensor))
                if args.keep_outputs:  # control: a consumer holding the whole layer, as a dict of HF tensors would
                    kept.append(tensor)
                del tensor  # streamed: each HF tensor is dropped before the next is built
        return count, equal

    (count, equal), extra, export_s, method = _peak_extra(export)
    item = torch.empty((), dtype=dtype).element_size()
    tensor_bytes = args.ffn * args.hidden * item
    shard_bytes = sum(t.numel() * t.element_size() for per in shards.values() for t in per.values())
    out = {
        "bench": "grouped_mlp_export",
        "consumer": "keeps every output (control)" if args.keep_outputs else "streams (drops each output)",
        "ep": args.ep,
        "etp": args.etp,
        "experts": args.experts,
        "hidden": args.hidden,
        "ffn": args.ffn,
        "dtype": args.dtype,
        "shard_bytes": shard_bytes,
        "expert_bytes": 3 * tensor_bytes,
        "hf_tensor_bytes": tensor_bytes,
        "export_peak_extra_bytes": extra,
        "peak_extra_over_expert": round(extra / (3 * tensor_bytes), 3),
        "peak_extra_over_layer": round(extra / shard_bytes, 4),
        "export_s": round(export_s, 4),
        "export_tensors": count,
        "bitwise_equal_to_source": None if args.no_verify else equal,
        "import_s_per_rank_max": round(max(import_s), 4),
        "import_s_per_rank_mean": round(sum(import_s) / len(import_s), 4),
        "import_peak_extra_bytes_max": max(import_extra),
        "peak_method": method,
        "rss_bytes": _status_kib("VmRSS") * 1024,
        "torch": torch.__version__,
    }
    sys.stdout.write(json.dumps(out) + "\n")


def main() -> None:
    """Parse; run each case in its own subprocess (or be one) and print its JSON line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=768, help="moe_ffn_hidden_size of one expert")
    p.add_argument("--qwen3-30b", action="store_true", help="Qwen3-30B-A3B's MoE layer: 128 experts, 2048, 768")
    p.add_argument("--cases", default="1x1,2x1,4x1,2x2", help="EPxETP, comma separated")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--no-verify", action="store_true", help="drop the HF source before export (no bitwise check)")
    p.add_argument("--keep-outputs", action="store_true", help="control: keep every exported tensor (whole layer)")
    p.add_argument("--ep", type=int, help=argparse.SUPPRESS)
    p.add_argument("--etp", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.qwen3_30b:
        args.experts, args.hidden, args.ffn = 128, 2048, 768
    if args.ep is not None:
        _worker(args)
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for case in args.cases.split(","):
        ep, etp = (int(x) for x in case.lower().split("x"))
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--ep",
            str(ep),
            "--etp",
            str(etp),
            "--experts",
            str(args.experts),
            "--hidden",
            str(args.hidden),
            "--ffn",
            str(args.ffn),
            "--dtype",
            args.dtype,
        ] + (["--no-verify"] if args.no_verify else [])
        cmd += ["--keep-outputs"] if args.keep_outputs else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            sys.stderr.write(proc.stderr)
            raise SystemExit(proc.returncode)
        sys.stdout.write(proc.stdout)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
