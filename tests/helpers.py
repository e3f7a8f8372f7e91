"""Test helpers: run the real `convcheck` CLI in a subprocess, read its JSON report, name planted bugs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class CliResult:
    code: int
    out: str
    err: str
    report: dict[str, Any] | None

    def findings(self, oracle: str | None = None) -> list[dict[str, Any]]:
        assert self.report is not None, f"no report (exit {self.code}): {self.err}"
        return [f for o in self.report["oracles"] if oracle in (None, o["name"]) for f in o["findings"]]

    def verdicts(self) -> dict[str, str]:
        assert self.report is not None, f"no report (exit {self.code}): {self.err}"
        return {o["name"]: o["verdict"] for o in self.report["oracles"]}


def run_cli(
    *args: str, tmp_path: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> CliResult:
    """Run `python -m convcheck ARGS`; when tmp_path is given, also ask for a JSON report and read it."""
    cmd = [sys.executable, "-m", "convcheck", *args]
    report_path = None
    if tmp_path is not None and args and args[0] == "verify":
        report_path = tmp_path / "report.json"
        cmd += ["--json", str(report_path)]
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    report = json.loads(report_path.read_text()) if report_path is not None and report_path.exists() else None
    return CliResult(proc.returncode, proc.stdout, proc.stderr, report)


def mutant(module: str, name: str) -> str:
    """The `--hook` spec of one planted bug in convcheck.mutants (e.g. mutant("bridge", "swap_qk_head0"))."""
    return f"convcheck.mutants.{module}:{name}"
