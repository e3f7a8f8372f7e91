"""Benchmark: convcheck.live.check of this checkout against another commit's, in one process on one job, interleaved
(base and new take turns after each bare export), so a shared or throttled machine slows both alike. Prints one JSON
object: each side's best and median seconds, as ratios to the bare export of the same rounds, and new / base. Each is
timed for the whole job, barrier to barrier (bench/_launch.timed). user_ratio_median: rank 0's user CPU seconds over
the export's (the kernel's share of a gloo export's waits, large on a small machine, left out).

    python bench/bench_live_ab.py --base HEAD~3 --realsize-layers 8 --tiny-dims --rounds 15
    python bench/bench_live_ab.py --base v0.1 --model tiny:qwen3-moe --tp 2 --ep 2

The base is `git archive BASE convcheck` renamed to the package `convcheck_base` (its own imports rewritten) in a
temporary folder, removed afterwards; the ranks, model and bridge are this checkout's (bench/_launch.rank_up).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from _launch import ROOT, launch, rank_up, timed  # type: ignore[import-not-found]
from bench_live import _checkpoint, model_options  # type: ignore[import-not-found]

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
    with rank_up(args.path, layout, args.device, load=not args.names_only) as ctx:
        _rounds(args, ctx, layout, {"base": base.check, "new": new.check})


def _rounds(args: argparse.Namespace, ctx: Any, layout: Any, checks: dict[str, Any]) -> None:
    model, bridge = ctx.model, ctx.bridge
    verdicts = {side: getattr(check(model, bridge), "verdict", None) for side, check in checks.items()}  # warm both
    seconds: dict[str, list[float]] = {"export": [], "base": [], "new": []}
    user: dict[str, list[float]] = {"export": [], "base": [], "new": []}  # rank 0's user CPU seconds
    for i in range(args.rounds):
        for side in ("export", *(("base", "new") if i % 2 == 0 else ("new", "base"))):
            started = os.times().user
            seconds[side].append(timed(ctx, functools.partial(_one, side, ctx, checks))[0])
            user[side].append(os.times().user - started)
    if ctx.rank != 0:
        return
    best = {k: min(v) for k, v in seconds.items()}
    median = {k: sorted(v)[len(v) // 2] for k, v in seconds.items()}
    user_median = {k: sorted(v)[len(v) // 2] for k, v in user.items()}
    print(json.dumps({
        "model": args.label, "layout": layout.label, "device": ctx.device, "base": args.base, "rounds": args.rounds,
        "verdicts": verdicts, "best_s": {k: round(v, 4) for k, v in best.items()},
        "median_s": {k: round(v, 4) for k, v in median.items()},
        "ratio_best": {k: round(best[k] / best["export"], 3) for k in ("base", "new")},
        "ratio_median": {k: round(median[k] / median["export"], 3) for k in ("base", "new")},
        "new_over_base_median": round(median["new"] / median["base"], 3), "goal": "<= 1.5",
        "user_ratio_median": {k: round(user_median[k] / user_median["export"], 3) for k in ("base", "new")},
    }))  # fmt: skip


def _one(side: str, ctx: Any, checks: dict[str, Any]) -> Any:
    """One bare export drain (side "export") or one side's live check."""
    if side == "export":
        return sum(1 for _ in ctx.bridge.export_hf_weights(ctx.model, cpu=ctx.device != "cuda", show_progress=False))
    return checks[side](ctx.model, ctx.bridge)


def main() -> None:
    """Parse; as a rank, measure; else build the model, write the base package and launch the ranks."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="HEAD", help="the commit to compare with (default HEAD: the uncommitted work), "
                   "or a folder holding another convcheck/")  # fmt: skip
    p.add_argument("--rounds", type=int, default=15)
    model_options(p)
    args = p.parse_args()
    if not args.path:
        _launch_ranks(args)
    else:
        _worker(args)


def _launch_ranks(args: argparse.Namespace) -> None:
    path, label = _checkpoint(args)
    with tempfile.TemporaryDirectory(prefix="convcheck-ab-") as tmp:  # the base package goes with it
        here = str(base_package(args.base, Path(tmp)))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH", "")]))
        launch(__file__, args.tp * args.pp * args.ep, [*sys.argv[1:], "--path", path, "--label", label])


if __name__ == "__main__":
    main()
