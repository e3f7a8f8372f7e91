"""Benchmark: an engine host's start (its process up and the checkpoint loaded by vLLM, the reference state read and
the fixed prompts generated: the engine oracle's `start` request) forked by the warm engine server
(convcheck.rollout.warm_engine) as a ratio to a fresh interpreter's, alternating, in one run. Prints one JSON object.

    python bench/bench_engine_start.py --model tiny:qwen3-vllm --repeats 3

The server's own start (importing torch, transformers and vLLM once) is reported apart: it is paid once per session.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from convcheck.api import resolve_model
from convcheck.rollout.client import EngineHost
from convcheck.rollout.environment import check_python
from convcheck.rollout.warm_link import SOCKET_ENV, serving_engine


def one_start(python: str, model: str, log: Path) -> tuple[float, str]:
    """Seconds from starting the engine host to its answer to `start`, and how it started ("warm" / "fresh")."""
    started = time.perf_counter()
    with EngineHost(python, log, 16.0) as host:
        host.request("start", model=model)
        return time.perf_counter() - started, host.started_as


def measure(model: str, python: str, repeats: int, scratch: Path) -> dict[str, Any]:
    started = time.perf_counter()
    with serving_engine(python, wait_s=300) as socket_path:
        ready = time.perf_counter() - started
        fresh, warm = [], []
        for n in range(repeats):
            os.environ.pop(SOCKET_ENV)
            seconds, how = one_start(python, model, scratch / f"fresh-{n}.log")
            assert how == "fresh", how
            fresh.append(round(seconds, 2))
            os.environ[SOCKET_ENV] = str(socket_path)
            seconds, how = one_start(python, model, scratch / f"warm-{n}.log")
            assert how == "warm", how
            warm.append(round(seconds, 2))
    return {
        "bench": "engine_start",
        "model": model,
        "repeats": repeats,
        "fresh_s": fresh,
        "warm_s": warm,
        "warm_over_fresh": round(statistics.median(warm) / statistics.median(fresh), 3),
        "server_ready_s": round(ready, 2),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny:qwen3-vllm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engine-python", default=None)
    args = parser.parse_args()
    python = check_python(args.engine_python)
    model = resolve_model(args.model)
    with tempfile.TemporaryDirectory() as scratch:
        print(json.dumps(measure(model, python, args.repeats, Path(scratch))))


if __name__ == "__main__":
    main()
