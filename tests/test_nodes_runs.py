"""`gate check` / `gate record` / `selftest` across hosts without launching ranks: the node options reach every launch,
the nodes agree on the whole run before the first one, and `convcheck oracles` says what each proves live."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from convcheck.cli.main import cli
from convcheck.engine.nodes import Nodes
from convcheck.engine.rollcall import agree, free_port
from convcheck.errors import BadInput, NodeLost, NodesDisagree, SetupError
from convcheck.gate import GOLDEN_DIR
from convcheck.oracles import ORACLES
from convcheck.workflows.gate_runner import Options, digests, prepare_case, read_index, run_prepared
from convcheck.workflows.kill_matrix import Launch
from convcheck.workflows.selftest import Runner, run_selftest
from tests.support.helpers import ROOT

CASE = "qwen3-moe/tp2ep2"


def _nodes(node: int, port: int = 5) -> Nodes:
    return Nodes(nnodes=2, node_rank=node, master_addr="127.0.0.1", master_port=port)


def test_oracles_says_what_each_proves_live() -> None:
    out = CliRunner().invoke(cli, ["oracles"]).output
    assert f"coverage\n  proves: {ORACLES['coverage'].proves}\n" in out
    assert f"  live (convcheck.live.check, inside a running job): {ORACLES['coverage'].live}\n" in out
    roundtrip = out.split("roundtrip\n", 1)[1].split("\nconfig\n", 1)[0]
    assert not ORACLES["roundtrip"].live and "live" not in roundtrip  # it needs the HF source: no live line


def test_gate_cases_carry_the_nodes_and_agree_across_scratch_folders(tmp_path: Path) -> None:
    case = read_index(GOLDEN_DIR)[CASE]
    jobs = []
    for node in (0, 1):
        (tmp_path / str(node)).mkdir()
        job, error = prepare_case(case, tmp_path / str(node) / case.file_name, Options(nodes=_nodes(node)))
        assert error is None and job.nodes == _nodes(node) and job.oracles and job.manifest_out
        jobs.append(job)
    assert jobs[0].manifest_out != jobs[1].manifest_out and jobs[0].agreed() == jobs[1].agreed()
    assert Options(nodes=_nodes(0)).writes and not Options(nodes=_nodes(1)).writes and Options().writes
    assert digests([GOLDEN_DIR / case.file_name, tmp_path / "none.json"])["none.json"] is None


class _Record:
    """A stand-in for api.verify that records how each launch was asked (the selftest's plumbing only)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, fixture: str, layout: str, **kwargs: Any) -> Any:
        self.calls.append({"layout": layout, **kwargs})
        raise BadInput("recorded")


def test_selftest_launches_span_the_nodes_that_split_them() -> None:
    record = _Record()
    runner = Runner(verify=record, device="cpu", nodes=_nodes(1))
    for layout in ("tp2ep2", "tp1"):
        report, error, _ = runner.run(Launch(fixture="tiny:qwen3-moe", layout=layout, oracles=("coverage",)))
        assert report is None and error == "recorded"
    assert record.calls[0]["nodes"] == _nodes(1)
    assert "nodes" not in record.calls[1]  # TP1: the nodes cannot split one rank; every node runs it by itself
    gpus = Runner(verify=record, device="cuda", visible_gpus=1, nodes=_nodes(0))
    assert gpus.skip_reason(Launch(fixture="tiny:qwen3-moe", layout="tp2ep2")) is None  # one GPU a node is enough
    assert "needs 2 GPU(s)" in (gpus.skip_reason(Launch(fixture="tiny:qwen3-moe", layout="tp4")) or "")
    with pytest.raises(BadInput, match=r"--jobs must be 1 with --nnodes"):
        run_selftest([], verify=record, jobs=2, nodes=_nodes(0))


def test_nodes_agree_on_the_whole_run_or_both_stop_naming_what_differs() -> None:
    port = free_port()
    runs = {0: {"command": "gate check", "case qwen3/tp2": {"a": 1}, "allow": []},
            1: {"command": "gate check", "case qwen3/tp1": {"a": 1}, "allow": []}}  # fmt: skip
    errors: dict[int, BaseException | None] = {}

    def node(rank: int, run: dict[str, Any]) -> None:
        try:
            agree(_nodes(rank, port), run, timeout_s=60)
            errors[rank] = None
        except BaseException as exc:  # noqa: BLE001 - handed to the asserts below
            errors[rank] = exc

    for same in (False, True):
        threads = [threading.Thread(target=node, args=(r, runs[0] if same else runs[r])) for r in (0, 1)]
        for thread in threads:  # node 0 first: a client retrying a port nobody listens on yet can connect to itself
            thread.start()
            time.sleep(0.5)
        for thread in threads:
            thread.join(timeout=90)
        if same:  # the next launch of the same meeting: every node agrees
            assert errors == {0: None, 1: None}
            continue
        for rank in (0, 1):
            assert isinstance(errors[rank], NodesDisagree), errors
            assert str(errors[rank]) == (
                "node 1 was started with another job than node 0 (case qwen3/tp1, case qwen3/tp2 differ): start every "
                "node with the same arguments"
            )


def _pair(tmp: Path, *runs: list[str]) -> list[subprocess.Popen[str]]:
    """Node 0 runs `runs[0]`, node 1 `runs[1]`, at one meeting point on 127.0.0.1 (started at once)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = []
    for node, args in enumerate(runs):
        flags = ["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        procs.append(subprocess.Popen([sys.executable, "-m", "convcheck", *args, *flags, "--timeout", "120"], cwd=tmp,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    return procs


def _ended(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    ended = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        ended.append((proc.returncode, out, err))
    return ended


@pytest.mark.fresh_process  # four fresh launchers (torch for the meeting point): ~30-60 s on 2 cores
def test_gate_and_selftest_nodes_started_with_other_arguments_stop_before_any_rank(tmp_path: Path) -> None:
    gate = _pair(tmp_path, ["gate", "check", "--case", CASE], ["gate", "check", "--case", "qwen3-moe/ep2"])
    other = ["selftest", "--no-warm", "--quick", "--only"]
    selftest = _pair(tmp_path, [*other, "swap_qk_head0"], [*other, "gqa_qk_swap_group1"])
    for code, out, err in _ended(gate):
        assert code == 2 and out == "", err
        assert err == (
            "convcheck: error: node 1 was started with another job than node 0 (golden, case qwen3-moe/ep2, case "
            "qwen3-moe/tp2ep2 differ): start every node with the same arguments\n"
        )
    (code0, out0, err0), (code1, out1, err1) = _ended(selftest)
    assert (code0, code1, out1) == (2, 2, ""), (err0, err1)
    for err in (err0, err1):
        assert err.endswith(
            "convcheck: error: node 1 was started with another job than node 0 (launches, mutants differ): start "
            "every node with the same arguments\n"
        )
    assert out0.startswith("selftest (quick") and not list(tmp_path.iterdir())


def test_a_lost_node_ends_the_whole_run_a_failed_launch_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from convcheck import api
    from convcheck.engine.rollcall import decide

    gone = {0: {"kind": "ok", "result": {}}, 1: {"kind": "gone", "error": "its launcher was interrupted by SIGTERM"}}
    with pytest.raises(NodeLost, match=r"^node 1: its launcher was interrupted by SIGTERM$"):
        decide(_nodes(0), gone)
    for error, ends_run in ((NodeLost("node 1 never joined"), True), (SetupError("rank 1 failed: OOM"), False)):

        def run(_job: Any, error: Exception = error) -> None:
            raise error

        monkeypatch.setattr(api, "run", run)
        if ends_run:
            with pytest.raises(NodeLost):
                run_prepared(("a job", None), Path("m.json"))
        else:
            assert run_prepared(("a job", None), Path("m.json")) == (None, "rank 1 failed: OOM")

    def lost(*_args: Any, **_kwargs: Any) -> Any:
        raise NodeLost("node 1 went silent")

    with pytest.raises(NodeLost):
        Runner(verify=lost, nodes=_nodes(0)).run(Launch(fixture="tiny:qwen3", layout="tp2"))
