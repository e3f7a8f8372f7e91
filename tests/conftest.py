"""Session-wide fixtures; the helpers tests import live in tests/support/helpers.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from convcheck.engine.launch import rank_env
from convcheck.engine.warm_client import serving
from convcheck.fork.client import SOCKET_ENV
from convcheck.rollout.environment import default_python
from convcheck.rollout.warm_link import serving_engine
from tests.support.helpers import PINNED_SPEC_ENV, ROOT


@pytest.fixture(scope="session", autouse=True)
def _cache_dir() -> None:
    """Use the repo's cache (set by the Makefile) or a private one, never the user's home."""
    os.environ.setdefault("CONVCHECK_CACHE_DIR", str(ROOT / ".cache"))


@pytest.fixture(scope="session", autouse=True)
def _temp_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Temp folders of the session (a kept setup-error log, a planted crash's job folder) go under pytest's own
    base temp, which pytest prunes, instead of piling up in the system temp dir."""
    import tempfile

    folder = tmp_path_factory.mktemp("t", numbered=False)
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # re-read TMPDIR


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A folder every xdist worker of this session sees (for runs several tests share: support.helpers.shared_run)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if worker_id != "master" else base


@pytest.fixture(scope="session", autouse=True)
def _warm_ranks(_temp_dir: None) -> Iterator[None]:
    """This worker's CPU launches fork their ranks, and its fixture builds their child, from a warm server
    (convcheck.engine.warm: megatron imported once, ~2 s a launch instead of ~20); launches before it is ready, and
    tests marked `torchrun`, use torchrun.
    CONVCHECK_TEST_TORCHRUN=1 runs the whole suite on torchrun."""
    if os.environ.get("CONVCHECK_TEST_TORCHRUN"):
        yield
        return
    with serving():
        yield


@pytest.fixture(scope="session")
def _warm_engine_server(_temp_dir: None) -> Iterator[None]:
    """This worker's engine oracles fork their vLLM engines from a warm engine server (convcheck.rollout.warm_engine:
    torch, transformers and vLLM imported once, ~5 s an engine start instead of ~20); started by the first test
    marked `engine`, which waits for it. CONVCHECK_TEST_FRESH_ENGINE=1 starts every engine fresh."""
    if os.environ.get("CONVCHECK_TEST_FRESH_ENGINE"):
        yield
        return
    with serving_engine(default_python(), rank_env("cpu"), wait_s=180):
        yield


@pytest.fixture(autouse=True)
def _warm_engine(request: pytest.FixtureRequest) -> None:
    """Tests marked `engine` run with the session's warm engine server (started on first use)."""
    if request.node.get_closest_marker("engine") is not None:
        request.getfixturevalue("_warm_engine_server")


@pytest.fixture(autouse=True)
def _torchrun_only(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests marked `torchrun` launch their ranks with torchrun, the default launcher, whatever the session has."""
    if request.node.get_closest_marker("torchrun") is not None:
        monkeypatch.delenv(SOCKET_ENV, raising=False)


@pytest.fixture(autouse=True)
def _local_spec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests marked `local_spec` run `verify` (tests.support.helpers.run_cli) in megatron-core's local layout."""
    if request.node.get_closest_marker("local_spec") is not None:
        monkeypatch.setenv(PINNED_SPEC_ENV, "local")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With $CONVCHECK_TEST_TIMES=FILE, one JSON line per test phase (nodeid, phase, seconds, outcome) appended as it
    ends: where the suite's time goes, readable while it runs (every xdist worker appends to the same file)."""
    path = os.environ.get("CONVCHECK_TEST_TIMES")
    if path:
        import json

        line = {"test": report.nodeid, "when": report.when, "s": round(report.duration, 2), "outcome": report.outcome}
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


LONGEST_FIRST = (
    "tests/test_cache_trust.py",
    "tests/test_bisect.py",
    "tests/test_multinode.py",
    "tests/test_pytest_plugin.py",
    "tests/test_live.py",
    "tests/test_compat.py",
    "tests/test_compat_device.py",
    "tests/test_nodes_runs.py",
    "tests/test_engine.py",
)
"""Files whose tests take a minute or more each (their own torchrun launches, fresh interpreters importing megatron):
scheduled first, so no xdist worker ends the session on one while the other waits; they need no warm server."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the LONGEST_FIRST files' tests before the others (stable otherwise)."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))
