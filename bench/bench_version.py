"""Benchmark: `convcheck version write` and `version check` at two model sizes; prints one JSON line.

    python bench/bench_version.py [--sizes 256x4,768x8] [--layout tp1] [--keep DIR]

Builds Qwen3 HF checkpoints (bf16, vocab 32000) of hidden x layers per size with transformers, writes a version
folder from each (ckpt/ torch_dist + 100 MB shards + manifest) and checks it. Reported per size: model bytes and the
largest tensor; seconds of write and check; rank 0's resident set before the streamed part and its high-water mark
after it (write: export -> shards; check: restore + export compared with the shards), and the peak RSS of a fresh
process running only the index and manifest checks. Flat means the streamed part's extra stays near one tensor
while the model grows (the model itself is in rank 0's memory either way). Everything built is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(folder: Path, hidden: int, layers: int) -> None:
    """A random Qwen3 checkpoint: hidden x layers, 4x MLP, 8 heads of 64 (4 KV), vocab 32000, bf16, 100 MB shards."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        vocab_size=32000,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="100MB")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}


def pure_child(folder: str) -> None:
    """In a fresh process: the index and manifest checks only; print seconds and peak RSS."""
    from convcheck.ckpt.folder import check_index, check_manifest
    from convcheck.ckpt.manifest import read_version_manifest

    t0 = time.perf_counter()
    manifest = read_version_manifest(Path(folder) / "manifest.json")
    structure = check_index(folder, manifest.index)
    checked, findings = check_manifest(folder, manifest, structure)
    hwm = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    out = {"seconds": round(time.perf_counter() - t0, 3), "peak_rss_MB": round(int(hwm.split()[1]) / 1024, 1)}
    print(json.dumps({**out, "tensors": checked, "findings": len(structure.findings) + len(findings)}))


def one_size(work: Path, hidden: int, layers: int, layout: str) -> dict[str, object]:
    """Build one checkpoint, write its version folder, check it; the measurements."""
    from convcheck.hf.checkpoint import open_checkpoint
    from convcheck.workflows.version import check_version, write_version

    source = work / f"qwen3-{hidden}x{layers}"
    build(source, hidden, layers)
    tensors = open_checkpoint(source).tensors.values()
    version = work / f"v-{hidden}x{layers}"
    t0 = time.perf_counter()
    written = write_version(version, str(source), layout, step=1, device="cpu", max_shard_bytes=100 * 10**6)
    write_s = time.perf_counter() - t0
    if written.findings:
        raise SystemExit(f"version write failed: {written.findings[0]}")
    t0 = time.perf_counter()
    report = check_version(version, device="cpu")
    check_s = time.perf_counter() - t0
    checks = {o.name: o for o in report.oracles}
    cmd = [sys.executable, __file__, "--pure-child", str(version)]
    pure = json.loads(
        subprocess.run(cmd, capture_output=True, text=True, check=True, env=_env()).stdout.splitlines()[-1]
    )
    check_metrics = checks["checkpoint"].metrics
    write_metrics = written.metrics or {}
    return {
        "model": f"hidden {hidden} x {layers} layers",
        "model_MB": round(sum(e.nbytes for e in tensors) / 1e6, 1),
        "largest_tensor_MB": round(max(e.nbytes for e in tensors) / 1e6, 1),
        "tensors": written.tensors,
        "shards": written.shards,
        "write_s": round(write_s, 1),
        "check_s": round(check_s, 1),
        "verdicts": {name: o.verdict for name, o in checks.items()},
        "write_rank0_rss_before_export_MB": write_metrics.get("rank0_rss_before_export_MB"),
        "write_rank0_export_peak_MB": write_metrics.get("rank0_export_peak_MB"),
        "check_rank0_restore_peak_MB": check_metrics.get("rank0_restore_peak_MB"),
        "check_rank0_rss_before_export_MB": check_metrics.get("rank0_rss_before_export_MB"),
        "check_rank0_export_peak_MB": check_metrics.get("rank0_export_peak_MB"),
        "pure_checks_peak_rss_MB": pure["peak_rss_MB"],
        "pure_checks_s": pure["seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256x4,768x8", help="hidden x layers per size, comma-separated")
    parser.add_argument("--layout", default="tp1")
    parser.add_argument("--keep", help="build in this folder and keep it")
    parser.add_argument("--pure-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pure_child:
        pure_child(args.pure_child)
        return
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-version-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
        results = [one_size(work, hidden, layers, args.layout) for hidden, layers in sizes]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    first, last = results[0], results[-1]
    growth = {
        "model": round(last["model_MB"] / first["model_MB"], 2),
        "write_export_extra_MB": [
            round(r["write_rank0_export_peak_MB"] - r["write_rank0_rss_before_export_MB"], 1) for r in results
        ],
        "check_export_extra_MB": [
            round(r["check_rank0_export_peak_MB"] - r["check_rank0_rss_before_export_MB"], 1) for r in results
        ],
        "check_restore_over_loaded_MB": [
            round(r["check_rank0_restore_peak_MB"] - r["check_rank0_rss_before_export_MB"], 1) for r in results
        ],
        "pure_checks_peak_rss_MB": [r["pure_checks_peak_rss_MB"] for r in results],
    }
    print(json.dumps({"layout": args.layout, "sizes": results, "growth": growth}))


if __name__ == "__main__":
    main()
