"""Warm CPU ranks (convcheck.engine.warm): the same verdicts as torchrun, never a server made from other code.

The stops (SIGINT, SIGTERM, a killed launcher) run under both launchers in tests/test_everyday.py.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from convcheck.cache import changed_since
from convcheck.engine import warm
from convcheck.fork.client import PIDS_FILE, SOCKET_ENV, import_env, source_key
from tests.support.helpers import ROOT, mutant, run_cli, wait_for_warm_server


def _comparable(report: dict) -> dict:
    """A report without its timings, memory peaks and paths (what differs between two runs of the same job)."""
    if isinstance(report, dict):
        return {k: _comparable(v) for k, v in report.items() if not k.endswith(("seconds", "_s", "_MB", "log"))}
    if isinstance(report, list):
        return [_comparable(v) for v in report]
    return report


@pytest.mark.ranks
def test_a_planted_bug_gets_the_same_report_from_warm_ranks_and_torchrun(tmp_path: Path) -> None:
    wait_for_warm_server()
    args = ("verify", "--model", "tiny:qwen3", "--tp", "2", "--hook", mutant("bridge", "swap_qk_head0"))
    runs = {}
    for launcher in ("warm", "torchrun"):
        env = {SOCKET_ENV: os.environ[SOCKET_ENV] if launcher == "warm" else ""}
        folder = tmp_path / launcher
        folder.mkdir()
        runs[launcher] = run_cli(*args, "--log-dir", str(folder / "job"), tmp_path=folder, env=env)
        assert runs[launcher].code == 1, runs[launcher].err
        assert (folder / "job" / PIDS_FILE).exists() == (launcher == "warm")
    warm_run, torchrun = runs["warm"], runs["torchrun"]
    assert warm_run.findings() and warm_run.findings() == torchrun.findings()
    assert _comparable(warm_run.report) == _comparable(torchrun.report)


@pytest.mark.ranks
def test_a_launcher_whose_import_environment_differs_uses_torchrun(tmp_path: Path) -> None:
    wait_for_warm_server()
    res = run_cli(
        "verify", "--model", "tiny:qwen3", "--oracle", "coverage,roundtrip", "--log-dir", str(tmp_path / "job"),
        tmp_path=tmp_path, env={"PYTHONHASHSEED": "7"},
    )  # fmt: skip
    assert res.code == 0, res.err
    assert res.verdicts() == {"coverage": "pass", "roundtrip": "pass"}
    assert not (tmp_path / "job" / PIDS_FILE).exists()  # the server refused; torchrun ran the ranks


@pytest.mark.ranks
def test_a_job_with_its_own_folder_before_pythonpath_is_served_warm(tmp_path: Path) -> None:
    """A user's repo put before the server's PYTHONPATH (as pytest's pytester does): the forked ranks find its modules
    where a fresh rank would, here a --hook planting the q/k swap, and the run stays warm."""
    wait_for_warm_server()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "my_trainer_hooks.py").write_text(
        "from convcheck.mutants.bridge import swap_qk_head0\n\n\ndef plant():\n    swap_qk_head0()\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path / "repo"), os.environ.get("PYTHONPATH", "")]))
    res = run_cli(
        "verify", "--model", "tiny:qwen3", "--oracle", "roundtrip", "--hook", "my_trainer_hooks:plant",
        "--log-dir", str(tmp_path / "job"), tmp_path=tmp_path, env={"PYTHONPATH": path},
    )  # fmt: skip
    assert res.code == 1, res.err
    assert {(f["tensor"], f["kind"]) for f in res.findings("roundtrip")} == {
        ("model.layers.0.self_attn.k_proj.weight", "bytes-differ"),
        ("model.layers.0.self_attn.q_proj.weight", "bytes-differ"),
    }
    assert (tmp_path / "job" / PIDS_FILE).exists()  # warm ranks ran it


def test_pythonpath_extras_are_served_only_when_they_shadow_nothing(tmp_path: Path) -> None:
    env = import_env(os.environ)
    key, own = source_key(), env["PYTHONPATH"]
    repo, shadow = tmp_path / "repo", tmp_path / "shadow"
    (repo / "my_pkg").mkdir(parents=True)
    (repo / "my_hooks.py").write_text("")
    shadow.mkdir()
    (shadow / "json.py").write_text("")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("")
    joined = lambda *parts: os.pathsep.join(filter(None, [*map(str, parts), own]))  # noqa: E731
    assert warm.extra_paths(joined("repo"), own, str(tmp_path)) == [str(repo)]
    assert warm.extra_paths(own, own, "/") == []
    assert warm.extra_paths(str(repo), "/elsewhere", "/") is None  # the server's own entries are not its tail
    ok = {"key": key, "import_env": {**env, "PYTHONPATH": joined(repo)}, "cwd": str(tmp_path)}
    assert warm._admission(ok, key, env) == (None, [str(repo)])
    for folder, held in ((shadow, shadow / "json.py"), (tmp_path / "site", tmp_path / "site" / "sitecustomize.py")):
        asked = {**ok, "import_env": {**env, "PYTHONPATH": joined(repo, folder)}}
        assert warm._admission(asked, key, env) == (
            f"the launcher's PYTHONPATH holds {held}, a module the server imported from elsewhere",
            [],
        )
    # this checkout on the path (a trainer script's PYTHONPATH) holds the very convcheck the server imported: served;
    # another copy of it is not
    assert warm._admission({**ok, "import_env": {**env, "PYTHONPATH": joined(ROOT)}}, key, env) == (None, [str(ROOT)])
    copy = tmp_path / "copy" / "convcheck"
    copy.mkdir(parents=True)
    assert warm._admission({**ok, "import_env": {**env, "PYTHONPATH": joined(copy.parent)}}, key, env)[0] == (
        f"the launcher's PYTHONPATH holds {copy}, a module the server imported from elsewhere"
    )
    assert (
        "does not end with the server's"
        in warm._admission(
            {**ok, "import_env": {**env, "PYTHONPATH": f"{own}{os.pathsep}{repo}" if own else ""}},
            key,
            {**env, "PYTHONPATH": "/x"},
        )[0]
    )


def test_the_server_refuses_other_source_and_another_import_environment() -> None:
    env = import_env(os.environ)
    key = source_key()
    assert key == source_key()
    assert warm._admission({"key": key, "import_env": env}, key, env) == (None, [])
    assert "source changed" in warm._admission({"key": "0" * 64, "import_env": env}, key, env)[0]
    other = {**env, "OMP_NUM_THREADS": "7"}
    assert "import-time environment" in warm._admission({"key": key, "import_env": other}, key, env)[0]
    assert warm._admission(None, key, env) == ("no request", [])


def test_an_edited_loaded_file_makes_the_server_stale_a_touched_one_does_not(tmp_path: Path) -> None:
    module = tmp_path / "loaded.py"
    module.write_text("X = 1\n")
    stat = module.stat()
    snapshot = {str(module): (stat.st_mtime_ns, stat.st_size, hashlib.sha256(module.read_bytes()).hexdigest())}
    assert changed_since(snapshot) is None
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: same bytes
    assert changed_since(snapshot) is None
    module.write_text("X = 2\n")  # same size, other bytes
    assert changed_since(snapshot) == f"{module} changed since the server loaded it"
    module.unlink()
    assert changed_since(snapshot) == f"{module} changed since the server loaded it"


def _files(folder: Path) -> dict[str, str]:
    """Every file under `folder` (its path relative to it) -> sha256 of its bytes."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.mark.ranks
def test_a_fixture_built_by_the_warm_server_is_the_fresh_childs_byte_for_byte(tmp_path: Path) -> None:
    """The fixture child forked by the warm server (torch, transformers and the CPU shims already loaded) writes the
    very bytes a fresh interpreter writes, for a built-in MoE fixture and its FP8 copy; its bad input is the child's
    one line; a server that refuses (another import environment) leaves the build to a fresh child."""
    from convcheck.fixtures import folders

    wait_for_warm_server()
    jobs = {
        "tiny": lambda how: ["tiny", "tiny:qwen3-moe", "--out", str(tmp_path / f"tiny-{how}")],
        "fp8": lambda how: ["fp8", str(tmp_path / f"tiny-{how}"), "--out", str(tmp_path / f"fp8-{how}")],
    }
    for name, args in jobs.items():
        warm_answer, fresh_answer = folders._run_warm(args("warm")), folders._run_fresh(args("fresh"))
        assert warm_answer is not None and (warm_answer[0], fresh_answer[0]) == (0, 0), (warm_answer, fresh_answer)
        built = _files(tmp_path / f"{name}-warm")
        assert built and built == _files(tmp_path / f"{name}-fresh"), name
    missing = tmp_path / "missing.json"
    answer = folders._run_warm(["config", str(missing)])
    assert answer is not None and answer[0] == 3
    assert answer[1].strip().splitlines() == [json.dumps({"bad_input": f"config file not found: {missing}"})]
    os.environ["PYTHONHASHSEED"], saved = "7", os.environ.get("PYTHONHASHSEED")
    try:
        assert folders._run_warm(["tiny", "tiny:qwen3", "--out", str(tmp_path / "refused")]) is None
    finally:
        if saved is None:
            del os.environ["PYTHONHASHSEED"]
        else:
            os.environ["PYTHONHASHSEED"] = saved
