"""The warm engine server (convcheck.rollout.warm_engine) and its client (convcheck.rollout.warm_link): what it admits,
that a forked engine answers as a fresh one does, and that it dies with its client. The engine oracle's own tests
(tests/test_engine.py) run on it; one of them (the folder transport) starts its engine fresh."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from convcheck.engine.launch import rank_env
from convcheck.rollout import protocol
from convcheck.rollout.environment import default_python, engine_env
from convcheck.rollout.warm_engine import admission
from convcheck.rollout.warm_link import SOCKET_ENV, import_env, start_warm
from tests.support.helpers import ROOT

PYTHON = "/venv/bin/python"


def test_the_server_admits_only_its_own_interpreter_and_import_environment() -> None:
    env = import_env({"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HOME": "/root", "PYTHONPATH": "/r"})
    assert env == {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/r", "VLLM_CPU_KVCACHE_SPACE": "1"}
    asked = {"python": PYTHON, "import_env": env}
    assert admission(asked, env, PYTHON, 3) is None
    assert admission({**asked, "python": "/other/python"}, env, PYTHON, 3) == (
        "the client asked for the interpreter /other/python, the server runs /venv/bin/python"
    )
    other = {**env, "OMP_NUM_THREADS": "4"}
    assert admission({**asked, "import_env": other}, env, PYTHON, 3) == (
        "the client's import-time engine environment differs from the server's: OMP_NUM_THREADS '4' (server '1')"
    )
    assert admission(asked, env, PYTHON, 2) == "the request did not pass the engine's stdin, stdout and log"


def test_no_server_means_a_fresh_engine(tmp_path: Path) -> None:
    with open(tmp_path / "log", "ab") as log:
        assert start_warm(PYTHON, log, environ={}) is None
        assert start_warm(PYTHON, log, environ={SOCKET_ENV: str(tmp_path / "absent")}) is None


CLIENT = """
import sys, time
sys.path.insert(0, {root!r})
from convcheck.rollout.warm_link import start_warm
with open({log!r}, "ab") as log:
    process = start_warm({python!r}, log)
print(process.pid if process else "refused", flush=True)
time.sleep(600)
"""


@pytest.mark.engine
@pytest.mark.skipif(not Path(default_python()).is_file(), reason="no engine environment: `make env-vllm`")
def test_a_forked_engine_answers_and_dies_with_its_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client asking the session's server gets an engine that answers requests (an unknown one: its one-line
    error, as a fresh host answers) and is killed once the client is; another interpreter is refused. The client
    runs with a CPU rank's environment, as the engine oracle's rank 0 does (the server serves those)."""
    for name, value in import_env(rank_env("cpu")).items():
        monkeypatch.setenv(name, value)
    python = str(Path(default_python()).absolute())
    assert os.environ.get(SOCKET_ENV), "the engine marker starts the session's warm engine server"
    with open(tmp_path / "log", "ab") as log:
        assert start_warm(str(tmp_path / "python"), log) is None
        process = start_warm(python, log)
        assert process is not None, (tmp_path / "log").read_text()
        protocol.send(process.stdin, {"op": "nonsense"})
        where = f"{ROOT}/convcheck/rollout/host.py:{_line('unknown request')}"
        error = "ValueError: unknown request 'nonsense'"
        assert protocol.receive(process.stdout, 60) == {"ok": False, "error": error, "where": where}
        protocol.send(process.stdin, {"op": "quit"})
        assert protocol.receive(process.stdout, 60) == {"ok": True}
        assert process.wait(30) == 0
    assert engine_env()["PYTHONPATH"] == str(ROOT)
    script = CLIENT.format(root=str(ROOT), log=str(tmp_path / "log"), python=python)
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        engine = int(client.stdout.readline())
        assert Path(f"/proc/{engine}").exists()
        client.send_signal(signal.SIGKILL)
        client.wait(10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{engine}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{engine}").exists(), "the forked engine outlived its client"
    finally:
        client.kill()
        client.wait()


def _line(text: str) -> str:
    """The line number of the first line of convcheck/rollout/host.py holding `text`."""
    lines = (ROOT / "convcheck" / "rollout" / "host.py").read_text().splitlines()
    return str(next(n for n, line in enumerate(lines, 1) if text in line))
