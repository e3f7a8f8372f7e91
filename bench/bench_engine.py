"""Benchmark: the engine oracle's engine-side protocol (fresh load, sign-flip poison, two syncs of every tensor and
their inspections: state read back and fixed prompts generated) as a ratio to what an RL trainer's engine does anyway
(the engine's own cold load of the same checkpoint plus one reload_weights of the same tensors), both through the
same engine process and shared-memory transport, in one run. Prints one JSON object.

    python bench/bench_engine.py --model tiny:qwen3-vllm
    python bench/bench_engine.py --model tiny:qwen3-moe-vllm
    python bench/bench_engine.py --synthetic-hidden 1024 --synthetic-layers 4   # a Qwen3 of these dims, random

The Megatron side (the bridge's export the sync streams) is the same in a trainer's sync and in the oracle, so it is
left out: the tensors come from the checkpoint files. Transport throughput is the shared-memory buckets' bytes per
second of the first sync (writer copy, engine copy-out and the engine's own loading).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from convcheck.api import resolve_model
from convcheck.rollout.client import EngineHost
from convcheck.rollout.environment import check_python


def _tensors(folder: str) -> list[tuple[str, Any]]:
    from safetensors.torch import load_file

    out: list[tuple[str, Any]] = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        out += sorted(load_file(str(path)).items())
    return out


def _synthetic(hidden: int, layers: int, folder: Path) -> str:
    """A Qwen3 with real per-layer proportions at `hidden` (head_dim 128, 4 KV heads, MLP 3x hidden), random bf16."""
    import torch
    import transformers

    heads = max(hidden // 128, 4)
    config = transformers.Qwen3Config(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=4,
                                      head_dim=128, intermediate_size=3 * hidden, num_hidden_layers=layers,
                                      vocab_size=32768, max_position_embeddings=256,
                                      tie_word_embeddings=False)  # fmt: skip
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(folder))
    return str(folder)


def _timed(step: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    value = step()
    return value, time.perf_counter() - started


def measure(model: str, python: str, chunk_mb: float, scratch: Path) -> dict[str, Any]:
    tensors = _tensors(model)
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    with EngineHost(python, scratch / "baseline.log", chunk_mb) as host:
        started = time.perf_counter()
        host.request("start", model=model)
        load = time.perf_counter() - started
        _, reload_s = _timed(lambda: host.sync("reload", tensors))
        baseline = time.perf_counter() - started
    with EngineHost(python, scratch / "oracle.log", chunk_mb) as host:
        started = time.perf_counter()
        host.request("start", model=model)
        host.request("poison", model=model)
        first = None
        for _ in range(2):
            _, sync_s = _timed(lambda: host.sync("reload", tensors))
            first = first if first is not None else sync_s
            seen = host.request("inspect")
            if any(".experts." in d["name"] for d in seen["diffs"]):
                host.request("repair")
                host.request("inspect")
        oracle = time.perf_counter() - started
    return {
        "model": model,
        "tensors": len(tensors),
        "bytes": nbytes,
        "baseline_load_plus_reload_s": round(baseline, 3),
        "baseline_load_s": round(load, 3),
        "baseline_reload_s": round(reload_s, 3),
        "oracle_engine_side_s": round(oracle, 3),
        "ratio": round(oracle / baseline, 3),
        "transport_bytes_per_s": round(nbytes / first, 1) if first else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:qwen3-vllm")
    parser.add_argument("--synthetic-hidden", type=int, default=0)
    parser.add_argument("--synthetic-layers", type=int, default=4)
    parser.add_argument("--chunk-mb", type=float, default=64.0)
    parser.add_argument("--engine-python", default=None)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    python = check_python(args.engine_python)
    with tempfile.TemporaryDirectory(prefix="convcheck-bench-engine-") as scratch:
        folder = (_synthetic(args.synthetic_hidden, args.synthetic_layers, Path(scratch) / "model")
                  if args.synthetic_hidden else resolve_model(args.model))  # fmt: skip
        runs = [measure(folder, python, args.chunk_mb, Path(scratch)) for _ in range(args.repeat)]
    label = (
        f"synthetic qwen3 hidden {args.synthetic_hidden} x {args.synthetic_layers} layers"
        if args.synthetic_hidden
        else args.model
    )
    best = min(runs, key=lambda r: r["ratio"])
    print(
        json.dumps({"bench": "engine", "model": label, "chunk_mb": args.chunk_mb, "best": best, "runs": runs}, indent=2)
    )


if __name__ == "__main__":
    main()
