"""A run ends in a complete report or a failure: a raising bridge is a finding (exit 1), anything else exit 2.

The real runs patch the real bridge (or an oracle's module function) through the hooks of convcheck.mutants.faults;
the launcher's choice of the rank to blame is also checked without ranks, from the files ranks leave behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from convcheck.engine.job import Job
from convcheck.engine.outcome import read_result
from convcheck.errors import SetupError
from convcheck.fixtures.build import build_fixture
from convcheck.layout import ParallelLayout
from tests.support.helpers import ROOT, mutant, run_cli

GLOO_ERROR = "RuntimeError: [gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:25236"


def _one_line(err: str, needle: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("convcheck: error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def qwen3() -> str:
    """tiny:qwen3 as a folder, so the launcher itself does not import torch to find it."""
    return str(build_fixture("tiny:qwen3"))


@pytest.mark.ranks
def test_an_import_that_raises_is_an_import_failed_finding(qwen3: str, tmp_path: Path) -> None:
    res = run_cli("verify", "--model", qwen3, "--oracle", "coverage", "--hook", mutant("faults", "import_raises"),
                  "--timeout", "120", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    assert "Traceback" not in res.err + res.out
    failed = [f for f in res.findings("coverage") if f["kind"] == "import-failed"]
    assert len(failed) == 1
    assert failed[0]["tensor"] == "<import>"
    assert "planted fault: load_weights_hf_to_megatron raised" in failed[0]["message"]
    assert res.verdicts() == {"coverage": "fail"}


@pytest.mark.ranks
def test_an_export_that_raises_is_an_export_failed_finding(qwen3: str, tmp_path: Path) -> None:
    res = run_cli("verify", "--model", qwen3, "--oracle", "coverage,roundtrip", "--hook",
                  mutant("faults", "export_raises"), "--timeout", "120", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    assert "Traceback" not in res.err + res.out
    for oracle in ("coverage", "roundtrip"):
        failed = [f for f in res.findings(oracle) if f["kind"] == "export-failed"]
        assert len(failed) == 1, oracle
        assert "planted fault: the export stream raised after 3 tensors" in failed[0]["message"]
    assert res.verdicts() == {"coverage": "fail", "roundtrip": "fail"}


@pytest.mark.ranks
def test_an_oracle_raising_on_one_rank_is_exit_2_naming_the_rank(qwen3: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run_cli("verify", "--model", qwen3, "--tp", "2", "--oracle", "coverage", "--hook",
                  mutant("faults", "coverage_raises_on_rank1"), "--timeout", "300", tmp_path=tmp_path,
                  timeout=400)  # fmt: skip
    assert time.monotonic() - t0 < 280  # rank 0 waits in a gather: the run must end before the timeout
    assert res.code == 2, res.out[-2000:] + res.err
    _one_line(res.err, "rank 1 failed: ValueError: planted fault in the coverage oracle on rank 1")
    assert res.report is None


@pytest.mark.ranks
def test_an_error_before_the_model_is_built_is_exit_2(qwen3: str, tmp_path: Path) -> None:
    res = run_cli("verify", "--model", qwen3, "--oracle", "coverage", "--hook", mutant("faults", "setup_raises"),
                  "--timeout", "120", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 2, res.err
    _one_line(res.err, "rank 0 failed: RuntimeError: planted fault: the model config was rejected")
    assert res.report is None


BUG = "import convcheck.api as api; api.prepare = lambda *a, **k: 1 / 0; from convcheck.cli.main import main; main()"


@pytest.mark.parametrize("debug", [False, True])
def test_a_bug_in_convcheck_is_exit_2(debug: bool, qwen3: str, tmp_path: Path) -> None:
    """A bug is never exit 1: one line without CONVCHECK_DEBUG, the traceback with it."""
    env = {k: v for k, v in os.environ.items() if k != "CONVCHECK_DEBUG"}
    if debug:
        env["CONVCHECK_DEBUG"] = "1"
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-c", BUG, "verify", "--model", qwen3, "--json", str(report)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert not report.exists()
    if debug:
        assert "Traceback" in proc.stderr and "ZeroDivisionError" in proc.stderr
    else:
        _one_line(proc.stderr, "internal error: ZeroDivisionError: division by zero (set CONVCHECK_DEBUG=1")


# --- which rank the launcher blames, from what the ranks left behind (no ranks) ------------------------------------


def _summary(*failures: tuple[int, int]) -> str:
    """The end of a torchrun log: one Failures entry per (rank, exit code)."""
    blocks = [f"[{i}]:\n  time      : 2026-11-30_14:22:50\n  host      : localhost\n  rank      : {rank} (local_rank: "
              f"{rank})\n  exitcode  : {code} (pid: {100 + rank})\n  error_file: <N/A>\n" for i, (rank, code) in
              enumerate(failures)]  # fmt: skip
    return "convcheck.engine.worker FAILED\nFailures:\n" + "".join(blocks[1:]) + "Root Cause:\n" + blocks[0]


def _job(tmp_path: Path, errors: dict[int, str], log: str) -> tuple[Job, Path]:
    """A TP2 job whose ranks left `errors` (rank -> one line, written in this order, 10 ms apart) and `log`."""
    job = Job(model_path=str(tmp_path), model_label="m", layout=ParallelLayout(tp=2), workdir=str(tmp_path))
    for n, (rank, error) in enumerate(errors.items()):
        path = job.error_file(rank)
        path.write_text(json.dumps({"status": "error", "rank": rank, "error": error}))
        os.utime(path, ns=(1_000_000_000 + n * 10_000_000,) * 2)
    log_file = tmp_path / "ranks.log"
    log_file.write_text(log)
    return job, log_file


def test_the_rank_whose_error_came_first_is_blamed(tmp_path: Path) -> None:
    """Rank 1 raised; rank 0 then lost its peer and wrote a gloo error (torchrun names rank 0 as root cause)."""
    job, log = _job(tmp_path, {1: "ValueError: planted", 0: GLOO_ERROR}, _summary((0, 4), (1, 4)))
    with pytest.raises(SetupError, match=r"^rank 1 failed: ValueError: planted \(log: "):
        read_result(job, 1, log, time.monotonic())


def test_a_rank_stopped_by_torchrun_is_not_reported_dead(tmp_path: Path) -> None:
    """Rank 1 raised; torchrun then stopped rank 0 with SIGTERM before it could write anything."""
    job, log = _job(tmp_path, {1: "ValueError: planted"}, _summary((1, 4), (0, -15)))
    with pytest.raises(SetupError, match=r"^rank 1 failed: ValueError: planted"):
        read_result(job, 1, log, time.monotonic())


def test_a_rank_that_died_silently_is_blamed(tmp_path: Path) -> None:
    """Rank 1 died without a word (os._exit); rank 0 then failed in a collective."""
    job, log = _job(tmp_path, {0: GLOO_ERROR}, _summary((1, 9), (0, 4)))
    with pytest.raises(SetupError, match=r"^rank 1 died without reporting an error"):
        read_result(job, 1, log, time.monotonic())


@pytest.mark.ranks
def test_an_export_raising_on_one_rank_stops_the_run_naming_that_rank(qwen3: str, tmp_path: Path) -> None:
    """Rank 1's export raises while rank 0 waits in the export's next collective: rank 1 ends the run within the
    grace (not the run's timeout), and every oracle it stopped fails on the one finding naming rank 1 and where."""
    res = run_cli("verify", "--model", qwen3, "--tp", "2", "--oracle", "coverage,roundtrip", "--hook",
                  mutant("faults", "export_raises_on_last_rank"), "--timeout", "240", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out + res.err
    assert res.verdicts() == {"coverage": "fail", "roundtrip": "fail"}
    findings = res.findings()
    assert [(f["tensor"], f["kind"]) for f in findings] == [("<export>", "export-failed")] * 2
    message = findings[0]["message"]
    assert message.startswith("bridge.export_hf_weights raised on rank 1 only: RuntimeError: planted fault: the export")
    assert "faults.py:" in message and message.endswith("rank 0 still waited in its collectives 20 s later, and the "
                                                        "run stopped there")  # fmt: skip
    printed = [line for line in res.out.splitlines() if "[export-failed]" in line]
    assert len(printed) == 1 and printed[0].endswith("(stopped: coverage, roundtrip)"), res.out


def test_a_run_stopped_by_one_rank_keeps_the_verdicts_made_before(tmp_path: Path) -> None:
    """Rank 0 finished coverage; rank 1's export then raised alone in roundtrip: coverage keeps its verdict,
    roundtrip and layout fail on the finding naming rank 1."""
    job = Job(model_path=str(tmp_path), model_label="m", layout=ParallelLayout(tp=2), workdir=str(tmp_path),
              oracles=("coverage", "roundtrip", "layout"))  # fmt: skip
    done = {"name": "coverage", "checked": 5, "findings": []}
    job.partial_file.write_text(json.dumps({"versions": {"megatron-bridge": "0.6.2"}, "oracles": [done]}))
    error = "bridge.export_hf_weights raised on rank 1 only: RuntimeError: x at a.py:1; rank 0 still waited ..."
    job.error_file(1).write_text(json.dumps({"status": "lone", "rank": 1, "error": error, "stage": "export",
                                             "oracle": "roundtrip"}))  # fmt: skip
    result = read_result(job, 1, tmp_path / "ranks.log", time.monotonic())
    stop = {"tensor": "<export>", "kind": "export-failed", "message": error, "detail": {"rank": 1, "stopped_run": True}}
    assert result["versions"] == {"megatron-bridge": "0.6.2"}
    assert result["oracles"] == [done, {"name": "roundtrip", "checked": 0, "findings": [stop]},
                                 {"name": "layout", "checked": 0, "findings": [stop]}]  # fmt: skip
