"""Test helpers: run the real `convcheck` CLI in a subprocess, read its JSON report, name planted bugs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[2]


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


PINNED_SPEC_ENV = "CONVCHECK_TEST_SPEC"
"""Set (by tests/conftest.py for tests marked `local_spec`): the `--spec` run_cli gives a verify that names none."""


def pinned_spec() -> str:
    """The `spec` a test's own `api.verify` call passes: its `local_spec` marker's, else verify's default."""
    return os.environ.get(PINNED_SPEC_ENV) or "te"


def run_cli(
    *args: str, tmp_path: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> CliResult:
    """Run `python -m convcheck ARGS`; when tmp_path is given, also ask for a JSON report and read it."""
    cmd = [sys.executable, "-m", "convcheck", *args]
    if args and args[0] == "verify" and "--spec" not in args and os.environ.get(PINNED_SPEC_ENV):
        cmd += ["--spec", os.environ[PINNED_SPEC_ENV]]
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


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[Path]:
    """`folder` (made when missing) held under its lock file for the block: the xdist workers that ask for one
    session-wide result wait there while the first one makes it."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder


def shared_run(root: Path, *args: str, timeout: float = 300, key: str | None = None) -> tuple[CliResult, Path]:
    """`run_cli(*args)` once per test session, by whichever xdist worker asks first; the others wait and read it.

    `{dir}` in an argument is replaced by the run's own folder (returned too), e.g. `--manifest {dir}/m.json`.
    """
    folder = root / "shared-runs" / hashlib.sha256((key or "\0".join(args)).encode()).hexdigest()[:16]
    with locked(folder):
        saved = folder / "result.json"
        if saved.exists():
            return CliResult(**json.loads(saved.read_text())), folder
        res = run_cli(*(a.replace("{dir}", str(folder)) for a in args), tmp_path=folder, timeout=timeout)
        saved.write_text(json.dumps(asdict(res)))
        return res, folder


def shared_value(root: Path, key: str, make: Callable[[], Any]) -> Any:
    """`make()` (a JSON value) once per test session, by whichever xdist worker asks first; the others wait and read
    it (what one fresh interpreter answers for several tests)."""
    folder = root / "shared-values" / key
    with locked(folder):
        saved = folder / "value.json"
        if not saved.exists():
            saved.write_text(json.dumps(make()))
        return json.loads(saved.read_text())


def matrix_run(root: Path, name: str, layout: tuple[str, ...]) -> tuple[CliResult, Path]:
    """The verify-matrix case of tiny:NAME at `layout` (every default oracle, gate manifest written), run once per
    session whatever the spelling of its layout (keyed by the case id; KeyError for a case not in the table)."""
    from tests.support.cases import CASES, case_id, pinned

    key = case_id(name, layout)
    spelled = pinned(next(lay for n, lay in CASES if n == name and case_id(n, lay) == key))
    return shared_run(root, "verify", "--model", f"tiny:{name}", *spelled, "--table", "failures",
                      "--manifest", "{dir}/manifest.json", key=key)  # fmt: skip


def processes_holding(folder: Path) -> list[int]:
    """Pids of live processes with a file under `folder` open (a rank's descendants keep its log open)."""
    prefix = str(folder.resolve())
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith(prefix) for link in links):
            out.append(int(entry.name))
    return out


def wait_for_warm_server(timeout: float = 120.0) -> None:
    """Wait until this session's warm server (tests/conftest.py) listens; AssertionError after `timeout` s."""
    from convcheck.fork.client import SOCKET_ENV

    deadline = time.monotonic() + timeout
    while not Path(os.environ.get(SOCKET_ENV, "/nonexistent")).exists():
        assert time.monotonic() < deadline, "the session's warm server did not come up"
        time.sleep(0.5)


def run_rank_script(
    script: Path, args: list[str], nproc: int, env: dict[str, str], folder: Path, timeout: float
) -> str:
    """Run `script ARGS...` on `nproc` CPU ranks as `torchrun --standalone` would (a stand-in for a user's trainer):
    forked by this session's warm server when it takes the job (megatron imported once), else under torchrun; the
    ranks' output (folder/ranks.log), for a failure message."""
    from convcheck.fork.client import SOCKET_ENV, run_script

    log = folder / "ranks.log"
    socket_path = os.environ.get(SOCKET_ENV, "")
    if socket_path:
        wait_for_warm_server()
        warm_env = {**env, "CUDA_VISIBLE_DEVICES": ""}
        exits = run_script(socket_path, str(script), args, nproc=nproc, env=warm_env, log_file=str(log),
                           timeout_s=timeout, cwd=str(ROOT))  # fmt: skip
        if exits is not None:
            return log.read_text() if log.exists() else ""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(script)]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    log.write_text(proc.stdout + proc.stderr)
    return log.read_text()
