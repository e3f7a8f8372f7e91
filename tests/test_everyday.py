"""Everyday use: signals stop every rank, temporary folders go, output fits a terminal, errors are one line."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from convcheck.cli.render import group_findings, oracle_summary
from convcheck.fork.client import PIDS_FILE, SOCKET_ENV
from convcheck.verdict import Finding, OracleVerdict
from tests.support.helpers import ROOT, mutant, run_cli, wait_for_warm_server

LAUNCHERS = ["torchrun", "warm"]
"""Every process-control test runs with both ways of starting ranks: torchrun, and forks of the session's warm server
(convcheck.engine.warm)."""


def _start(tmp_path: Path, *args: str, launcher: str = "torchrun") -> subprocess.Popen[str]:
    """Start `convcheck verify` with its temporary folders under tmp_path/tmp, its ranks started by `launcher`."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "COLUMNS": "200"}
    if launcher == "torchrun":
        env.pop(SOCKET_ENV, None)
    else:
        wait_for_warm_server()
    cmd = [sys.executable, "-m", "convcheck", "verify", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_ranks(
    proc: subprocess.Popen[str], count: int, timeout: float = 90.0, jobs: Path | None = None
) -> list[psutil.Process]:
    """The run's processes once `count` ranks run: its own descendants (torchrun), or the agent and ranks the warm
    server forked for it, named by the agent's pids file in the job folder under `jobs`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if jobs is not None:
            for pids_file in jobs.glob(f"convcheck-*/{PIDS_FILE}"):
                pids = json.loads(pids_file.read_text())
                if len(pids["ranks"]) >= count:
                    return [psutil.Process(pid) for pid in [pids["agent"], *pids["ranks"]]]
        else:
            kids = psutil.Process(proc.pid).children(recursive=True)
            workers = [k for k in kids if "convcheck.engine.worker" in " ".join(_cmdline(k))]
            if len(workers) >= count:
                return kids
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("ranks did not start")


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _all_gone(procs: list[psutil.Process], timeout: float = 20.0) -> list[int]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive]


@pytest.mark.ranks
@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_every_rank_and_cleans_up(tmp_path: Path, sig: signal.Signals, code: int, launcher: str) -> None:
    args = ("--model", "tiny:qwen3", "--tp", "2", "--oracle", "coverage", "--hook", mutant("faults", "hang_rank1"))
    proc = _start(tmp_path, *args, launcher=launcher)
    kids = _wait_for_ranks(proc, 2, jobs=tmp_path / "tmp" if launcher == "warm" else None)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [f"convcheck: interrupted by {sig.name}; stopped all ranks"], err
    assert _all_gone(kids) == []
    assert list((tmp_path / "tmp").iterdir()) == []  # no convcheck-* job folder, no torchelastic_*


@pytest.mark.ranks
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_killed_launcher_takes_its_ranks_along(tmp_path: Path, launcher: str) -> None:
    args = ("--model", "tiny:qwen3", "--tp", "2", "--oracle", "coverage", "--hook", mutant("faults", "hang_rank1"))
    proc = _start(tmp_path, *args, launcher=launcher)
    kids = _wait_for_ranks(proc, 2, jobs=tmp_path / "tmp" if launcher == "warm" else None)
    proc.kill()
    proc.communicate(timeout=30)
    assert _all_gone(kids) == []


@pytest.mark.ranks
def test_progress_on_a_terminal_and_nothing_extra_when_piped(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    env = {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "120"}
    cmd = [sys.executable, "-m", "convcheck", "verify", "--model", "tiny:qwen3", "--oracle", "coverage,roundtrip"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out = proc.communicate(timeout=60)[0]
    os.close(master)
    assert proc.returncode == 0
    text = seen.decode(errors="replace")
    assert "loading the checkpoint" in text and "oracle roundtrip" in text
    assert "PASS tiny:qwen3 TP1 on cpu" in out
    assert list(tmp_path.iterdir()) == []
    piped = run_cli("verify", "--model", "tiny:qwen3", "--oracle", "coverage,roundtrip")
    assert piped.code == 0 and piped.err == ""  # piped: no progress at all
    lines = piped.out.splitlines()
    assert all(line == line.rstrip() for line in lines)
    assert any(
        line.startswith("PASS coverage: checked 44 names (25 HF tensors + 19 Megatron parameters)") for line in lines
    )


@pytest.mark.ranks
def test_reused_log_dir_does_not_report_an_old_rank_error(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    stale = {"status": "error", "rank": 0, "error": "RuntimeError: from an earlier run"}
    (log_dir / "rank0.error.json").write_text(json.dumps(stale))
    res = run_cli("verify", "--model", "tiny:qwen3", "--oracle", "coverage", "--log-dir", str(log_dir))
    assert res.code == 0, res.err
    assert (log_dir / "ranks.log").is_file()  # kept, since it was asked for


@pytest.mark.ranks
def test_setup_error_keeps_the_log_and_names_it(tmp_path: Path) -> None:
    proc = _start(tmp_path, "--model", "tiny:qwen3", "--tp", "2", "--hook", mutant("faults", "kill_rank1"))
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    log = Path(err.strip().rpartition("log: ")[2].rstrip(")"))
    assert log.is_file() and log.parent.parent == tmp_path / "tmp"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--model", "tiny:qwen3", "--tp", "0"), "0 is not in the range"),
        ((), "Missing option '--model'"),
        (("--model", "tiny:qwen3", "--oracle", ""), "needs at least one oracle name"),
        (("--model", "tiny:qwen3", "--oracle", ",,"), "needs at least one oracle name"),
        (("--model", "tiny:qwen3", "--json", "."), "is a folder, not a file"),
        (("--model", "tiny:qwen3", "--json", "README.md/report.json"), "not a folder: README.md"),
        (("--model", "tiny:qwen3", "--junit", "/nonexistent/x.xml"), "output folder does not exist"),
        (("--model", "tiny:qwen3", "--experts", "te-grouped"), "needs a MoE model"),
        (("--model", "tiny:qwen3", "--table", "wide"), "'wide' is not one of"),
    ],
)
def test_usage_errors_are_one_line(args: tuple[str, ...], needle: str) -> None:
    res = run_cli("verify", *args)
    assert res.code == 2, res.err
    assert res.err.strip().splitlines() == [res.err.strip()] and needle in res.err, res.err
    assert res.out == ""


def test_help_lists_exit_codes_and_examples() -> None:
    res = run_cli("verify", "--help")
    assert res.code == 0
    assert "143  terminated (SIGTERM)" in res.out and "convcheck verify --model tiny:qwen3-moe --tp 2 --ep 2" in res.out


def test_a_pickled_weights_folder_says_what_it_found(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02")
    res = run_cli("verify", "--model", str(tmp_path))
    assert res.code == 2 and "only pickled torch weights (pytorch_model.bin)" in res.err


def test_findings_on_numbered_names_share_one_line() -> None:
    findings = [
        Finding(tensor=f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight", kind="missing", message="not exported")
        for layer in range(48)
        for e in range(128)
    ] + [Finding(tensor="lm_head.weight", kind="bytes-differ", message="1/2 elements differ")]
    lines = group_findings(findings)
    assert lines == [
        "model.layers.{0-47}.mlp.experts.{0-127}.up_proj.weight: [missing] 6144 names, same finding; "
        "first model.layers.0.mlp.experts.0.up_proj.weight: not exported",
        "lm_head.weight: [bytes-differ] 1/2 elements differ",
    ]
    verdict = OracleVerdict(name="roundtrip", checked=70, findings=tuple(findings[:2]))
    assert oracle_summary(verdict).startswith("checked 70 tensors, 2 finding(s) on 2 name(s)")


def test_rank_tmpdir_is_short_enough_for_sockets(tmp_path: Path) -> None:
    """A deep --log-dir gets a short TMPDIR of its own (multiprocessing's AF_UNIX listeners live under it)."""
    from convcheck.engine.launch import TMPDIR_MAX, rank_tmpdir

    shallow = Path("/tmp") / f"cc-short-{os.getpid()}"
    shallow.mkdir()
    assert rank_tmpdir(shallow) == shallow / "tmp"
    deep = tmp_path / ("deep-" * 12)
    short = rank_tmpdir(deep)
    assert short.parent != deep and short.is_dir() and len(str(short)) <= TMPDIR_MAX
    short.rmdir()
    (shallow / "tmp").rmdir()
    shallow.rmdir()


def test_rank_tmpdir_stays_short_under_a_deep_system_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A $TMPDIR itself too deep for a socket path: the ranks' TMPDIR goes under /tmp, nothing left in $TMPDIR."""
    import tempfile

    from convcheck.engine.launch import TMPDIR_MAX, rank_tmpdir

    system = tmp_path / ("sys-" * 16)
    system.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system))
    short = rank_tmpdir(tmp_path / ("deep-" * 12))
    assert short.is_dir() and len(str(short)) <= TMPDIR_MAX and short.parent == Path("/tmp")
    assert list(system.iterdir()) == []
    short.rmdir()


def test_short_rank_tmpdirs_of_killed_launchers_are_swept(tmp_path: Path) -> None:
    """A launcher killed before its cleanup (SIGKILL, a hard test timeout) leaves its short rank TMPDIR under /tmp;
    the next launch removes it, and leaves alone those of live launchers."""
    import subprocess
    import sys

    from convcheck.engine.launch import SHORT_PREFIX, rank_tmpdir

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = Path("/tmp") / f"{SHORT_PREFIX}{int(gone.stdout)}-test"
    alive = Path("/tmp") / f"{SHORT_PREFIX}{os.getppid()}-test"
    for folder in (dead, alive):
        (folder / "torchelastic_x").mkdir(parents=True, exist_ok=True)
    short = rank_tmpdir(tmp_path / ("deep-" * 12))
    try:
        assert not dead.exists() and alive.is_dir() and short.is_dir()
        assert short.name.startswith(f"{SHORT_PREFIX}{os.getpid()}-")
    finally:
        for folder in (dead, alive, short):
            shutil.rmtree(folder, ignore_errors=True)


def test_a_launch_whose_rendezvous_port_was_taken_is_relaunched_and_only_then(tmp_path: Path) -> None:
    """torchrun --standalone picks a free port and binds it later: a launch that lost it in between (EADDRINUSE, as a
    parallel test worker can cause) is started again; any other failure is the run's own."""
    from convcheck.engine.launch import PORT_RETRIES, _port_taken

    log = tmp_path / "ranks.log"
    log.write_text(
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
        "port: 37405, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use\n"
    )
    assert _port_taken(log) and PORT_RETRIES >= 1
    log.write_text("RuntimeError: shape mismatch in decoder.layers.0.mlp.linear_fc1.weight\n")
    assert not _port_taken(log)
    assert not _port_taken(tmp_path / "missing.log")


def test_a_relaunch_after_a_lost_port_reads_only_its_own_attempt(tmp_path: Path) -> None:
    """The warm agent's ranks report a lost rendezvous port in their error files and the log: before the relaunch,
    those are cleared, so the relaunch's verdict is read alone (a stale EADDRINUSE error file would fail it)."""
    from convcheck.engine.job import Job
    from convcheck.engine.launch import forget_attempt
    from convcheck.layout import ParallelLayout

    job = Job(model_path=str(tmp_path), model_label="m", layout=ParallelLayout(tp=2), workdir=str(tmp_path))
    log = tmp_path / "ranks.log"
    log.write_text("name: EADDRINUSE, message: address already in use\n")
    for rank in range(2):
        job.error_file(rank).write_text(json.dumps({"status": "error", "rank": rank, "error": "EADDRINUSE"}))
    job.partial_file.write_text("{}")
    job.save()
    forget_attempt(job, log)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.json"]
