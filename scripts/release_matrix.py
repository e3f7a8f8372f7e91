"""Run `convcheck verify` (every oracle) per bridge release x fixture x layout in the release envs; print a table.

    python scripts/release_matrix.py --releases 0.4.2,0.5.1 --fixtures qwen3,nemotron-h --out out/releases
    python scripts/release_matrix.py --table out/releases      # only (re)print the table from the JSON results

Each case runs `.venv-bridge-R/bin/convcheck verify --model tiny:F LAYOUT --json out/releases/R/F-L.json` (make env
BRIDGE=R first). The cell is `pass`, `fail: ORACLE: TENSOR [KIND]` (first finding of each failing oracle) or
`exit 2: LINE`. Cases run one after another (each is one torchrun launch).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUTS = {"tp1": ["--tp", "1"], "tp2": ["--tp", "2"], "ep2": ["--ep", "2"]}
FIXTURE_LAYOUTS = {
    "qwen3-moe": ("tp1", "tp2", "ep2"),
    "nemotron-h": ("tp1", "tp2", "ep2"),
    "nemotron-h-moe": ("tp1", "tp2", "ep2"),
}
DEFAULT_FIXTURES = (
    "qwen2", "qwen2-tied", "qwen3", "qwen3-moe", "qwen3-moe-unnorm", "llama", "nemotron-h", "nemotron-h-moe"
)  # fmt: skip


def run_case(release: str, fixture: str, layout: str, out: Path, timeout: int) -> dict:
    """One verify launch; its outcome as a dict (also written beside the JSON report)."""
    exe = ROOT / f".venv-bridge-{release}" / "bin" / "convcheck"
    report = out / release / f"{fixture}-{layout}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(exe), "verify", "--model", f"tiny:{fixture}", *LAYOUTS[layout], "--table", "none", "--json", str(report)]
    env = {"CONVCHECK_CACHE_DIR": str(ROOT / ".cache"), **os.environ, "OMP_NUM_THREADS": "1", "CONVCHECK_DEVICE": "cpu"}
    env.pop("PYTHONPATH", None)  # the release env's own convcheck (editable) and pins only
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        code, err = proc.returncode, proc.stderr.strip().splitlines()
    except subprocess.TimeoutExpired:
        code, err = 124, [f"timed out after {timeout} s"]
    outcome = {
        "release": release,
        "fixture": fixture,
        "layout": layout,
        "code": code,
        "seconds": round(time.perf_counter() - started, 1),
        "error": err[-1] if err and code == 2 else "",
    }
    if code == 124:
        outcome["error"] = err[-1]
    report.with_suffix(".outcome.json").write_text(json.dumps(outcome, indent=1) + "\n")
    return outcome


def cell(outcome: dict, report: Path) -> str:
    """The table cell of one case: pass, the first finding of each failing oracle, or the exit-2 line."""
    if outcome["code"] not in (0, 1):
        line = re.sub(r"/\S*/fixtures/[\w.-]+", "the fixture", outcome["error"].removeprefix("convcheck: error: "))
        line = re.sub(r"Failed to load configuration from .*? Last error: ", "", line)
        line = re.sub(r"\{('[^{}]*')\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", line)
        return f"exit {outcome['code']}: {line}"
    data = json.loads(report.read_text())
    failing = [o for o in data["oracles"] if o["verdict"] != "pass"]
    if not failing:
        return "pass"
    parts = []
    for oracle in failing:
        first = oracle["findings"][0] if oracle["findings"] else {"tensor": "-", "kind": "no findings"}
        more = f" (+{len(oracle['findings']) - 1})" if len(oracle["findings"]) > 1 else ""
        parts.append(f"{oracle['name']}: `{first['tensor']}` [{first['kind']}]{more}")
    return "; ".join(parts)


def _version_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def table(out: Path) -> str:
    """Markdown table of every recorded case under `out`: one row per release and fixture, one column per layout."""
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for path in out.glob("*/*.outcome.json"):
        outcome = json.loads(path.read_text())
        report = path.with_name(path.name.replace(".outcome.json", ".json"))
        cells.setdefault((outcome["release"], outcome["fixture"]), {})[outcome["layout"]] = cell(outcome, report)
    order = {name: i for i, name in enumerate(DEFAULT_FIXTURES)}
    rows = ["| bridge | fixture | TP1 | TP2 | EP2 |", "| --- | --- | --- | --- | --- |"]
    for release, fixture in sorted(cells, key=lambda k: (_version_key(k[0]), order.get(k[1], 99), k[1])):
        by_layout = cells[(release, fixture)]
        shown = [by_layout.get(layout, "") for layout in LAYOUTS]
        if len({c for c in shown if c}) == 1 and shown[0].startswith("exit 2"):  # one setup line for the row
            shown = [shown[0], *("same" if c else "" for c in shown[1:])]
        rows.append(f"| {release} | tiny:{fixture} | " + " | ".join(shown) + " |")
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default="")
    parser.add_argument("--fixtures", default=",".join(DEFAULT_FIXTURES))
    parser.add_argument("--layouts", default="", help="comma list (default: tp1,tp2 and ep2 for MoE fixtures)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "releases")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--table", type=Path, help="only print the table of the results under this folder")
    args = parser.parse_args()
    if args.table:
        print(table(args.table), end="")
        return 0
    for release in filter(None, args.releases.split(",")):
        for fixture in args.fixtures.split(","):
            layouts = args.layouts.split(",") if args.layouts else FIXTURE_LAYOUTS.get(fixture, ("tp1", "tp2"))
            for layout in layouts:
                outcome = run_case(release, fixture, layout, args.out, args.timeout)
                print(json.dumps(outcome), flush=True)
    print(table(args.out), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
