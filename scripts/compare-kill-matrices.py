#!/usr/bin/env python3
"""Compare two `convcheck selftest --json` kill matrices (e.g. a CUDA run and a CPU run of the same catalog).

For every (mutant, layout) row that ran in both: the same status and the same credited findings (oracle, tensor,
kind, first index). Prints a JSON summary; exit 0 when they agree, 1 when a row differs, 2 on bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def rows(path: str) -> dict[tuple[str, str], dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    return {(r["name"], r["layout"]): r for r in data["mutants"] if r.get("status", "killed") != "skipped"}


def key(finding: dict[str, Any]) -> str:
    return json.dumps([finding["oracle"], finding["tensor"], finding["kind"], finding["first_index"]])


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: compare-kill-matrices.py A.json B.json", file=sys.stderr)
        return 2
    try:
        a, b = rows(argv[0]), rows(argv[1])
    except (OSError, ValueError, KeyError) as exc:
        print(f"compare-kill-matrices: error: {exc}", file=sys.stderr)
        return 2
    both = sorted(set(a) & set(b))
    differ = []
    for row in both:
        ra, rb = a[row], b[row]
        fa, fb = sorted(map(key, ra["findings"])), sorted(map(key, rb["findings"]))
        if ra["status"] != rb["status"] or fa != fb:
            differ.append(
                {
                    "mutant": row[0],
                    "layout": row[1],
                    "status": [ra["status"], rb["status"]],
                    "only_in_a": sorted(set(fa) - set(fb))[:5],
                    "only_in_b": sorted(set(fb) - set(fa))[:5],
                }
            )
    devices = [sorted({a[r]["device"] for r in both}), sorted({b[r]["device"] for r in both})]
    summary = {
        "a": argv[0],
        "b": argv[1],
        "rows_compared": len(both),
        "devices": devices,
        "findings_compared": sum(len(a[r]["findings"]) for r in both),
        "rows_differ": differ,
        "agree": not differ,
    }
    print(json.dumps(summary, indent=1))
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
