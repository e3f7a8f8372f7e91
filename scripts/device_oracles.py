#!/usr/bin/env python3
"""Planted bugs of the oracles outside the default set (sync, checkpoint, reshard), one rank, on each device.

Runs every case on each device of DEVICES (default "cuda cpu"; JOBS at a time), writes each device's runs to
$OUT/oracles-<device>.json, merges the runs of the files in MERGE (e.g. a CPU side run on another machine), and checks
that both devices exit alike and name the same findings (oracle, tensor, kind, first index): on a GPU a real bug must
fail by name, as on the CPU. Prints and writes ($OUT/oracles-cuda-vs-cpu.json) one JSON summary; exit 0 when every
case has its expected exit code on both devices with equal findings. On a GPU machine, after
`source scripts/device-env.sh`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

M = "convcheck.mutants"
FUSED = ("--receiver", "fused")
CASES: dict[str, tuple[int, tuple[str, ...]]] = {
    # name: (expected exit code, verify arguments); every case is one rank
    "sync-clean": (0, ("tiny:qwen3-moe", "--oracle", "receiver,idempotence,delta", *FUSED)),
    "receiver-drop-v": (1, ("tiny:qwen3", "--oracle", "receiver", "--receiver", f"{M}.sync:DropVReceiver")),
    "receiver-swap-gate-up": (1, ("tiny:qwen3", "--oracle", "receiver", "--receiver", f"{M}.sync:SwapGateUpReceiver")),
    "idempotence-transpose": (1, ("tiny:qwen3", "--oracle", "idempotence,receiver", "--receiver",
                                  f"{M}.sync:TransposeOnReloadReceiver")),
    "idempotence-accumulate": (1, ("tiny:qwen3", "--oracle", "idempotence", "--receiver",
                                   f"{M}.sync:AccumulateOnReloadReceiver")),
    "sender-flip-bit": (1, ("tiny:qwen3", "--oracle", "roundtrip,receiver", "--sender", f"{M}.sync:flip_bit", *FUSED)),
    "sender-bucket-offset": (1, ("tiny:qwen3-moe", "--oracle", "roundtrip", "--sender",
                                 f"{M}.sync:bucket_offset_off_by_one")),
    "sender-duplicate-drop": (1, ("tiny:qwen3-moe", "--oracle", "coverage,receiver", "--sender",
                                  f"{M}.sync:duplicate_and_drop", *FUSED)),
    "delta-index-off": (1, ("tiny:qwen3", "--oracle", "delta", "--hook", f"{M}.sync:delta_index_off_by_one")),
    "delta-empty-not-noop": (1, ("tiny:qwen3", "--oracle", "delta", "--hook", f"{M}.sync:empty_delta_not_noop")),
    "distckpt-clean": (0, ("tiny:qwen3-moe", "--oracle", "distckpt", "--resume-layout", "tp1")),
    "distckpt-key-dropped": (1, ("tiny:qwen3", "--oracle", "distckpt", "--resume-layout", "tp1", "--hook",
                                 f"{M}.checkpoint:drop_key_on_restore")),
    "reshard-clean": (0, ("tiny:qwen3", "--oracle", "reshard", "--target-tp", "1", "--target-tp", "2",
                          "--target-tp", "4")),
    "reshard-planted": (1, ("tiny:qwen3", "--oracle", "reshard", "--target-tp", "2", "--target-tp", "4",
                            "--hook", f"{M}.reshard:replicated_linear_proj",
                            "--hook", f"{M}.reshard:qkv_no_deinterleave",
                            "--hook", f"{M}.reshard:kv_not_replicated")),
}  # fmt: skip


GPU_ONLY_KINDS = {"main-param-differs", "moment-misplaced"}
"""Findings of the distckpt oracle's optimizer part, which runs on CUDA only (megatron-core's DDP and distributed
optimizer need it: convcheck.ckpt.optimizer.CPU_BLOCKERS); a CPU run cannot name them."""


def shared(findings: list[str]) -> list[str]:
    """The findings a CPU run can also make."""
    return [f for f in findings if json.loads(f)[2] not in GPU_ONLY_KINDS]


def run(case: str, device: str, folder: Path) -> dict:
    code, args = CASES[case]
    report = folder / f"{case}-{device}.json"
    cmd = [sys.executable, "-m", "convcheck", "verify", "--model", *args, "--device", device, "--json", str(report)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    data = json.loads(report.read_text()) if report.exists() else None
    keys = sorted(
        json.dumps([o["name"], f["tensor"], f["kind"], f.get("detail", {}).get("first_index")])
        for o in (data or {}).get("oracles", [])
        for f in o["findings"]
    )
    return {"case": case, "device": (data or {}).get("device", device), "exit": proc.returncode,
            "expected_exit": code, "seconds": round(time.perf_counter() - t0, 1), "findings": keys,
            "tail": (proc.stdout + proc.stderr).strip().splitlines()[-1:]}  # fmt: skip


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(int(os.environ.get("JOBS", "6"))) as pool:
        devices = os.environ.get("DEVICES", "cuda cpu").split()
        jobs = [(c, d) for c in CASES for d in devices]
        results = list(pool.map(lambda cd: run(cd[0], cd[1], Path(tmp)), jobs))
    for device in devices:  # each device's runs alone, so a CPU side run elsewhere can be merged (MERGE=file)
        mine = [r for r in results if r["device"] == device]
        (out / f"oracles-{device}.json").write_text(json.dumps(mine, indent=1))
    for extra in filter(None, os.environ.get("MERGE", "").split()):
        results += json.loads(Path(extra).read_text())
    by = {(r["case"], r["device"]): r for r in results}
    cases = []
    for case in CASES:
        gpu, cpu = by.get((case, "cuda")), by.get((case, "cpu"))
        if not (gpu and cpu):
            cases.append({"case": case, "ok": False, "cuda": gpu, "cpu": cpu})
            continue
        ok = gpu["exit"] == cpu["exit"] == gpu["expected_exit"]
        ok = ok and shared(gpu["findings"]) == cpu["findings"] and (gpu["exit"] == 0) == (not gpu["findings"])
        only = sorted(set(gpu["findings"]) - set(cpu["findings"]))
        cases.append({"case": case, "ok": ok, "cuda_only_optimizer_findings": only, "cuda": gpu, "cpu": cpu})
    compared = sum(len(c["cpu"]["findings"]) for c in cases if c["cpu"] and c["ok"])  # those both devices can name
    summary = {"agree": all(c["ok"] for c in cases), "cases": len(cases), "findings_compared": compared,
               "results": cases}  # fmt: skip
    (out / "oracles-cuda-vs-cpu.json").write_text(json.dumps(summary, indent=1))
    for c in cases:
        g, p = (
            c["cuda"] or {"exit": "-", "findings": [], "seconds": 0, "tail": []},
            c["cpu"] or {"exit": "-", "findings": []},
        )
        print(f"{'ok ' if c['ok'] else 'BAD'} {c['case']}: cuda exit {g['exit']} ({len(g['findings'])} findings, "
              f"{g['seconds']} s), cpu exit {p['exit']} ({len(p['findings'])} findings); {g['tail']}")  # fmt: skip
    print(f"agree: {summary['agree']}, {summary['findings_compared']} findings compared")
    return 0 if summary["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
