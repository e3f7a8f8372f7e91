"""Benchmark: convcheck.live.check of this checkout against another commit's, in one process on one job, interleaved
(base and new take turns after each bare export), so a shared or throttled machine slows both alike. Prints one JSON
object: each side's best and median seconds, as ratios to the bare export of the same rounds, and new / base.

    python bench/bench_live_ab.py --base HEAD~3 --realsize-layers 8 --tiny-dims --rounds 15
    python bench/bench_live_ab.py --base v0.1 --model tiny:qwen3-moe --tp 2 --ep 2

The base is `git archive BASE convcheck` renamed to the package `convcheck_base` (its own imports rewritten) in a
temporary folder, removed afterwards; the ranks, model and bridge are this checkout's (bench/_launch.rank_up).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from _launch import ROOT, rank_up  # type: ignore[import-not-found]
from bench_live import _checkpoint  # type: ignore[import-not-found]

BASE_PACKAGE = "convcheck_base"


def base_package(ref: str, into: Path) -> Path:
    """`convcheck/` of commit `ref` (or of the folder `ref` names, for a copy without git history) as the package
    `convcheck_base` under `into`, its imports pointed at itself."""
    package = into / BASE_PACKAGE
    if (Path(ref) / "convcheck").is_dir():
        shutil.copytree(Path(ref) / "convcheck", package)
    else:
        git = ["git", "-C", str(ROOT), "archive", ref, "convcheck"]
        with tarfile.open(fileobj=io.BytesIO(subprocess.run(git, capture_output=True, check=True).stdout)) as tar:
            tar.extractall(into, filter="data")
        (into / "convcheck").rename(package)
    own = re.compile(r"\bconvcheck(?=\.|\s+import\b|$)", re.MULTILINE)
    for path in package.rglob("*.py"):
        text = path.read_text()
        path.write_text(own.sub(BASE_PACKAGE, text))
    return into


def _worker(args: argparse.Namespace) -> None:
    import importlib

    from convcheck.layout import ParallelLayout

    new = importlib.import_module("convcheck.live")
    base = importlib.import_module(f"{BASE_PACKAGE}.live")
    layout = ParallelLayout(tp=args.tp, pp=args.pp, ep=args.ep)
    with rank_up(args.path, layout, args.device) as ctx:
        _rounds(args, ctx, layout, {"base": base.check, "new": new.check})


def _rounds(args: argparse.Namespace, ctx: Any, layout: Any, checks: dict[str, Any]) -> None:
    model, bridge = ctx.model, ctx.bridge
    verdicts = {side: getattr(check(model, bridge), "verdict", None) for side, check in checks.items()}  # warm both
    seconds: dict[str, list[float]] = {"export": [], "base": [], "new": []}
    for i in range(args.rounds):
        for side in ("export", *(("base", "new") if i % 2 == 0 else ("new", "base"))):
            started = time.perf_counter()
            if side == "export":
                for _ in bridge.export_hf_weights(model, cpu=ctx.device != "cuda", show_progress=False):
                    pass
            else:
                checks[side](model, bridge)
            seconds[side].append(time.perf_counter() - started)
    if ctx.rank != 0:
        return
    best = {k: min(v) for k, v in seconds.items()}
    median = {k: sorted(v)[len(v) // 2] for k, v in seconds.items()}
    print(json.dumps({
        "model": args.label, "layout": layout.label, "device": ctx.device, "base": args.base, "rounds": args.rounds,
        "verdicts": verdicts, "best_s": {k: round(v, 4) for k, v in best.items()},
        "median_s": {k: round(v, 4) for k, v in median.items()},
        "ratio_best": {k: round(best[k] / best["export"], 3) for k in ("base", "new")},
        "ratio_median": {k: round(median[k] / median["export"], 3) for k in ("base", "new")},
        "new_over_base_median": round(median["new"] / median["base"], 3), "goal": "<= 1.5",
    }))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="HEAD", help="the commit to compare with (default HEAD: the uncommitted work), "
                   "or a folder holding another convcheck/")  # fmt: skip
    p.add_argument("--model", default="tiny:qwen3")
    for dim in ("tp", "pp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--realsize-layers", type=int, default=0)
    p.add_argument("--tiny-dims", action="store_true")
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--label", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.path:
        _worker(args)
        return
    path, label = _checkpoint(args)
    world = args.tp * args.pp * args.ep
    with tempfile.TemporaryDirectory(prefix="convcheck-ab-") as tmp:
        here = base_package(args.base, Path(tmp))
        path_list = os.pathsep.join(filter(None, [str(ROOT), str(here), os.environ.get("PYTHONPATH", "")]))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": tmp, "PYTHONPATH": path_list}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", __file__,
               *sys.argv[1:], "--path", path, "--label", label]  # fmt: skip
        proc = subprocess.run(cmd, check=False, env=env, cwd=ROOT, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        sys.exit(proc.returncode or 1)
    sys.stdout.write(lines[-1] + "\n")


if __name__ == "__main__":
    main()
