"""Benchmark: `convcheck gate check` over a subset of cases against the separate `convcheck verify` runs it replaces.

Usage: python bench/bench_gate.py [--case qwen3/tp1 --case qwen3/tp2] [--golden DIR]
Warms the fixtures and the layout oracle's TP1 references first (untimed), then times one `convcheck verify` per
case (every oracle, as the gate runs them) and one `convcheck gate check --case ...` over the same cases; prints
one JSON object: seconds of each, the ratio (goal <= 1.3) and the gate's own exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _convcheck(*args: str) -> tuple[int, float]:
    """Run `python -m convcheck ARGS` quietly; (exit code, wall seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "convcheck", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200"}, check=False)  # fmt: skip
    return proc.returncode, time.perf_counter() - t0


def _verify_args(case: dict) -> list[str]:
    from convcheck.layout import ParallelLayout

    layout = ParallelLayout.parse(case["layout"])
    args = ["verify", "--model", case["model"], "--quiet"]
    args += layout.cli_args()
    if case.get("pad_vocab"):
        args += ["--pad-vocab", str(case["pad_vocab"])]
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", default=None, help="gate case id (default: qwen3/tp1, qwen3/tp2)")
    parser.add_argument("--golden", default=None, help="gate folder (default: convcheck's golden manifests)")
    args = parser.parse_args()
    from convcheck.gate import GOLDEN_DIR

    golden = Path(args.golden) if args.golden else GOLDEN_DIR
    index = {c["id"]: c for c in json.loads((golden / "index.json").read_text())["cases"]}
    ids = args.case or ["qwen3/tp1", "qwen3/tp2"]
    cases = [index[i] for i in ids]
    for case in cases:  # warm-up: fixtures built, TP1 references cached, for both sides alike
        _convcheck(*_verify_args(case), "--oracle", "layout")
    verify_s = {}
    for case in cases:
        code, seconds = _convcheck(*_verify_args(case))
        verify_s[case["id"]] = round(seconds, 2)
    gate_args = ["gate", "check", *([str(golden)] if args.golden else [])]
    for case_id in ids:
        gate_args += ["--case", case_id]
    gate_code, gate_s = _convcheck(*gate_args)
    total = sum(verify_s.values())
    out = {
        "cases": ids,
        "verify_s": verify_s,
        "verify_total_s": round(total, 2),
        "gate_check_s": round(gate_s, 2),
        "ratio": round(gate_s / total, 3),
        "goal": "<= 1.3",
        "gate_exit_code": gate_code,
    }
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
