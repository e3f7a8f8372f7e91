"""Runs spanning hosts: two launchers on 127.0.0.1 as two nodes (--nnodes), and convcheck inside a user's torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from convcheck.engine.job import Job
from convcheck.engine.nodes import Nodes, check_across_nodes, make_nodes
from convcheck.engine.rollcall import decide, free_port
from convcheck.errors import BadInput, SetupError
from convcheck.layout import ParallelLayout
from tests.support.helpers import ROOT

CONVCHECK = [sys.executable, "-m", "convcheck"]
MOE = ["--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "4"]  # 4 ranks: 2 per node, TP inside a node, EP across


def test_node_flags_are_checked() -> None:
    assert make_nodes(1, None, None, None) is None
    assert make_nodes(2, 1, "h", 29400) == Nodes(nnodes=2, node_rank=1, master_addr="h", master_port=29400)
    with pytest.raises(BadInput, match="--nnodes 2 needs --node-rank, --master-port"):
        make_nodes(2, None, "h", None)
    with pytest.raises(BadInput, match=r"--node-rank must be in 0\.\.1, got 2"):
        make_nodes(2, 2, "h", 1)
    with pytest.raises(BadInput, match="--node-rank must be 0 with --nnodes 1"):
        make_nodes(1, 1, None, None)
    nodes = make_nodes(2, 1, "h", 1)
    assert nodes is not None and list(nodes.local_ranks(4)) == [2, 3]
    with pytest.raises(BadInput, match="--nnodes 2 must divide the layout's 3 ranks"):
        nodes.per_node(3)
    with pytest.raises(BadInput, match="the save oracle writes a folder that every rank reads back"):
        check_across_nodes(nodes, 4, ("coverage", "save"))


def test_job_keeps_its_nodes_and_nodes_agree_on_the_rest(tmp_path: Path) -> None:
    nodes = Nodes(nnodes=2, node_rank=1, master_addr="h", master_port=5)
    job = Job(model_path="/a", model_label="tiny:qwen3", layout=ParallelLayout(tp=2), workdir=str(tmp_path),
              oracles=("coverage",), nodes=nodes)  # fmt: skip
    assert Job.load(job.save()) == job
    other = Job(model_path="/b", model_label="tiny:qwen3", layout=ParallelLayout(tp=2), workdir="/x",
                oracles=("coverage",), nodes=Nodes(nnodes=2, node_rank=0, master_addr="h", master_port=5))  # fmt: skip
    assert job.agreed() == other.agreed()  # paths and the node's own rank aside
    from dataclasses import replace

    assert replace(other, oracles=("roundtrip",)).agreed() != job.agreed()


def test_every_node_ends_the_same_way() -> None:
    nodes = Nodes(nnodes=2, node_rank=1, master_addr="h", master_port=5)
    result = {"status": "ok", "oracles": []}
    assert decide(nodes, {0: {"kind": "ok", "result": result}, 1: {"kind": "ok", "result": None}}) == result
    with pytest.raises(SetupError, match=r"^node 1 stopped without reporting its ranks' end"):
        decide(nodes, {0: {"kind": "ok", "result": result}, 1: None})
    with pytest.raises(BadInput, match=r"^node 0: --ep must divide"):
        decide(nodes, {0: {"kind": "bad_input", "error": "--ep must divide"}, 1: {"kind": "error", "error": "x"}})
    peer = "rank 0 failed: Connection closed by peer [127.0.0.1]:1"
    with pytest.raises(SetupError, match=r"^node 1: rank 2 failed: OOM; node 0 then stopped$"):
        decide(nodes, {0: {"kind": "error", "error": peer}, 1: {"kind": "error", "error": "rank 2 failed: OOM"}})


def _launchers(
    tmp: Path, args: list[str], mark: str, port: int | None = None, command: tuple[str, ...] = ("verify",)
) -> list[subprocess.Popen[bytes]]:
    """Node 1's launcher, then node 0's, both on this host (their output in tmp/nodeK.out / .err), running this
    checkout's convcheck (PYTHONPATH: the cwd is `tmp`); `{node}` in an argument becomes the node's rank."""
    port = port or free_port()
    env = {**os.environ, "CONVCHECK_TEST_MARK": mark, "PYTHONPATH": str(ROOT)}
    procs = []
    for node in (1, 0):
        flags = ["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        with open(tmp / f"node{node}.out", "wb") as out, open(tmp / f"node{node}.err", "wb") as err:
            mine = [arg.replace("{node}", str(node)) for arg in args]
            procs.append(subprocess.Popen([*CONVCHECK, *command, *mine, *flags, "--timeout", "300"], stdout=out,
                                          stderr=err, env=env, cwd=tmp))  # fmt: skip
    return procs[::-1]


def _left(mark: str) -> list[str]:
    """Command lines of processes still carrying `mark` in their environment (a launcher's torchrun or ranks)."""
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.environ().get("CONVCHECK_TEST_MARK") == mark:
                left.append(" ".join(proc.info["cmdline"] or []))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


def _ended(procs: list[subprocess.Popen[bytes]], tmp: Path) -> list[tuple[int, str, str]]:
    codes = [p.wait(timeout=420) for p in procs]
    return [(c, (tmp / f"node{n}.out").read_text(), (tmp / f"node{n}.err").read_text()) for n, c in enumerate(codes)]


@pytest.mark.ranks
def test_two_nodes_pass_then_a_planted_bug_fails_on_both(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    (tmp_path / "pass").mkdir()
    good = [*MOE, "--oracle", "coverage,roundtrip,mapping"]
    (zero, out0, err0), (one, out1, err1) = _ended(_launchers(tmp_path / "pass", good, mark), tmp_path / "pass")
    assert (zero, one) == (0, 0), (err0, err1)
    assert "PASS tiny:qwen3-moe TP2xEP4 on cpu: 3/3 oracles pass" in out0
    assert out1 == "convcheck: node 1 of 2: pass (node 0 prints the report)\n" and err1 == ""

    (tmp_path / "bug").mkdir()
    bug = [*MOE, "--oracle", "roundtrip,mapping", "--hook", "convcheck.mutants.bridge:swap_qk_head0"]
    (zero, out0, err0), (one, out1, err1) = _ended(_launchers(tmp_path / "bug", bug, mark), tmp_path / "bug")
    assert (zero, one) == (1, 1), (err0, err1)
    assert ("FAIL roundtrip: model.layers.0.self_attn.k_proj.weight: [bytes-differ] 256/512 elements differ; first "
            "at index [0, 0]: got -0.00616455078125 (0xbbca), expected -0.01300048828125 (0xbc55)") in out0  # fmt: skip
    assert "FAIL mapping: model.layers.0.self_attn.q_proj.weight: [export-bytes-differ]" in out0
    assert "FAIL tiny:qwen3-moe TP2xEP4 on cpu: 0/2 oracles pass" in out0
    assert out1 == "convcheck: node 1 of 2: fail (node 0 prints the report)\n" and err1 == ""
    assert _left(mark) == []


@pytest.mark.ranks
def test_a_gate_over_two_cases_on_two_nodes(tmp_path: Path) -> None:
    """`gate check` over two cases (1 rank a node each): node 1 follows node 0 case by case; the bug planted in the
    pp2 case only fails it on both nodes' exit codes, node 0 names it, node 1 prints one line and writes nothing."""
    mark = uuid.uuid4().hex
    hook = f"{ROOT / 'tests' / 'support' / 'hooks_nodes.py'}:swap_qk_head0_without_tp"
    args = ["--case", "qwen3/tp2", "--case", "qwen3/pp2", "--hook", hook, "--json", "gate{node}.json"]
    procs = _launchers(tmp_path, args, mark, command=("gate", "check"))
    (zero, out0, err0), (one, out1, err1) = _ended(procs, tmp_path)
    assert (zero, one) == (1, 1), (err0[-3000:], err1[-3000:])
    assert ("FAIL model.layers.0.self_attn.k_proj.weight: [bytes-changed] bytes changed: sha256 ea01cf30dfb9 -> "
            "81547249f11c; roundtrip now: [bytes-differ] 256/512 elements differ; first at index [0, 0]: got "
            "-0.00616455078125 (0xbbca), expected -0.01300048828125 (0xbc55)") in out0  # fmt: skip
    assert "FAIL qwen3/pp2: 5 difference(s)" in out0 and "PASS qwen3/tp2: 0 difference(s)" in out0
    assert "FAIL gate: 1/2 case(s) match" in out0
    assert [line.split(":")[0] for line in err0.splitlines()] == ["[1/2] qwen3/pp2", "[2/2] qwen3/tp2"]
    assert out1 == "convcheck: node 1 of 2: fail (node 0 prints the report)\n" and err1 == ""
    report = json.loads((tmp_path / "gate0.json").read_text())
    assert {c["id"]: c["status"] for c in report["cases"]} == {"qwen3/pp2": "fail", "qwen3/tp2": "pass"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gate0.json", "node0.err", "node0.out", "node1.err",
                                                          "node1.out"]  # fmt: skip
    assert _left(mark) == []


@pytest.mark.ranks
def test_nodes_started_with_other_jobs_stop_before_any_rank(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ}
    procs = []
    for node, oracle in ((1, "coverage"), (0, "roundtrip")):
        flags = ["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        procs.append(subprocess.Popen([*CONVCHECK, "verify", *MOE, "--oracle", oracle, *flags, "--timeout", "120"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env))  # fmt: skip
    for proc in procs:
        out, err = proc.communicate(timeout=200)
        assert proc.returncode == 2 and out == b""
        assert err.decode() == (
            "convcheck: error: node 1 was started with another job than node 0 (oracles differ): start every node "
            "with the same arguments\n"
        )


@pytest.mark.ranks
def test_a_killed_node_stops_both_and_leaves_no_process(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    zero, one = _launchers(tmp_path, [*MOE, "--oracle", "roundtrip"], mark)
    deadline = time.monotonic() + 240
    while not any("torch.distributed.run" in " ".join(c.cmdline()) for c in _children(one.pid)):
        assert time.monotonic() < deadline and one.poll() is None, "node 1 never started its ranks"
        time.sleep(0.5)
    time.sleep(3)
    one.send_signal(signal.SIGTERM)
    (code0, out0, err0), (code1, out1, err1) = _ended([zero, one], tmp_path)
    assert (code0, code1) == (2, 143)
    assert err1 == "convcheck: interrupted by SIGTERM; stopped all ranks\n"
    assert err0.startswith("convcheck: error: node 1: its launcher was interrupted by SIGTERM") and out0 == ""
    time.sleep(1)
    assert _left(mark) == []


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.ranks
def test_convcheck_as_torchruns_entry_point(tmp_path: Path) -> None:
    """`torchrun ... -m convcheck verify`: torchrun's processes are the ranks; one run with a planted bug: rank 0
    prints the report once, the passing oracle and the bug named, and the exit code is the verdict's."""
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "convcheck",
            "verify", "--model", "tiny:qwen3-moe", "--ep", "2",
            "--oracle", "coverage,roundtrip,mapping"]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if k != "CONVCHECK_WARM_SOCKET"}, "TMPDIR": str(tmp_path)}
    bad = subprocess.run([*base, "--hook", "convcheck.mutants.bridge:swap_qk_head0"], capture_output=True, text=True,
                         env=env, timeout=300, cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 1, bad.stderr[-2000:]
    assert bad.stdout.count("FAIL tiny:qwen3-moe EP2 on cpu: 1/3 oracles pass") == 1
    assert bad.stdout.count("PASS coverage: checked ") == 1
    assert "FAIL roundtrip: model.layers.0.self_attn.k_proj.weight: [bytes-differ]" in bad.stdout
    assert "FAIL mapping: model.layers.0.self_attn.q_proj.weight: [export-bytes-differ]" in bad.stdout
    assert not list(Path(tmp_path).glob("convcheck-torchrun-*"))
