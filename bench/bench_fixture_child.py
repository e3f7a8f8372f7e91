"""Benchmark: the fixture child (`python -m convcheck.fixtures.child`: a built-in fixture, a `--from-config` shrink)
forked by the warm server (convcheck.engine.warm) as a ratio to a fresh interpreter's, alternating, in one run; the
two folders of each build compared byte for byte. Prints one JSON object.

    python bench/bench_fixture_child.py --fixtures tiny:qwen3,tiny:qwen3-moe,tiny:deepseek-v3 --repeats 2

The server's own start (importing torch, megatron and transformers once) is reported apart: it is paid once per
session (per pytest-xdist worker in the test suite).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from convcheck.engine.warm_client import serving
from convcheck.fixtures import folders

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "data" / "llama-3.1-8b.config.json"


def _files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def _timed(run: Any, args: list[str]) -> float:
    started = time.perf_counter()
    answer = run(args)
    assert answer is not None and answer[0] == 0, answer
    return time.perf_counter() - started


def measure(jobs: dict[str, list[str]], repeats: int, scratch: Path) -> dict[str, Any]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the server sets for itself: else it refuses the builds
    started = time.perf_counter()
    with serving(wait_s=600):
        ready = time.perf_counter() - started
        fresh: list[float] = []
        warm: list[float] = []
        identical = True
        for n in range(repeats):
            for name, args in jobs.items():
                outs = {how: scratch / f"{name.replace(':', '-')}-{how}-{n}" for how in ("fresh", "warm")}
                fresh.append(round(_timed(folders._run_fresh, [*args, "--out", str(outs["fresh"])]), 2))
                warm.append(round(_timed(folders._run_warm, [*args, "--out", str(outs["warm"])]), 2))
                identical &= _files(outs["fresh"]) == _files(outs["warm"])
    return {
        "bench": "fixture_child",
        "builds": list(jobs),
        "repeats": repeats,
        "fresh_s": fresh,
        "warm_s": warm,
        "warm_over_fresh": round(statistics.median(warm) / statistics.median(fresh), 3),
        "bytes_identical": identical,
        "server_ready_s": round(ready, 2),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", default="tiny:qwen3,tiny:qwen3-moe,tiny:deepseek-v3")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    jobs = {name: ["tiny", name] for name in args.fixtures.split(",")}
    jobs["config:llama-3.1-8b"] = ["config", str(CONFIG)]
    with tempfile.TemporaryDirectory() as scratch:
        print(json.dumps(measure(jobs, args.repeats, Path(scratch))))


if __name__ == "__main__":
    main()
