"""Candidate environments (`make env BRIDGE=TREE|WHEEL|REPO@REF`): naming, content stamps, a changed tree giving a
fresh environment, the versions its interpreter reports, bad input, and the gate report naming the candidate."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from convcheck.cli.gate import print_gate
from convcheck.errors import BadInput
from convcheck.workflows.candidate import nearest_release, parse_bridge, plan
from convcheck.workflows.candidate_env import CANDIDATE_FILE, build, candidate_info, candidate_line, describe
from tests.support.bridge_history import QWEN3, History, make_history
from tests.support.helpers import ROOT

SCRIPT = str(ROOT / "scripts" / "make-env.sh")
IN_PACKAGE = QWEN3.removeprefix("src/megatron/bridge/")
BASE = Path(sys.prefix)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return make_history(tmp_path_factory.mktemp("bridge") / "Megatron-Bridge")


def _edit(repo: Path) -> None:
    """An uncommitted change in the bridge package."""
    with (repo / QWEN3).open("a") as f:
        f.write("# a local edit\n")


def _make_env(spec: str, env_dir: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONVCHECK_BASE_VENV": str(BASE), "CONVCHECK_ENV_DIR": str(env_dir), **extra}
    return subprocess.run(["bash", SCRIPT, spec], capture_output=True, text=True, env=env, check=False)


def test_tree_env_is_named_by_what_it_holds_and_rebuilt_when_the_tree_changes(history: History, tmp_path: Path) -> None:
    repo, head = history.repo, history.fixed
    res = _make_env(str(repo), tmp_path)
    assert res.returncode == 0, res.stderr
    env = tmp_path / f".venv-bridge-0.6.2+g{head[:9]}"
    assert f"make-env: creating {env.name} (bridge 0.6.2 tree, core 0.19.2, transformers 5.12.1; pins of release " \
        "0.6.2)" in res.stdout  # fmt: skip
    assert f"megatron-bridge 0.6.2+g{head[:9]}, transformers 5.12.1" in res.stdout
    assert (env / "bin" / "convcheck").is_file() and (env / "bridge-src/megatron/bridge" / IN_PACKAGE).is_file()
    info = json.loads((env / CANDIDATE_FILE).read_text())
    assert (info["bridge"]["kind"], info["bridge"]["commit"], info["bridge"]["dirty"]) == ("tree", head, False)
    assert candidate_line(info).startswith(f"candidate: megatron-bridge 0.6.2 (commit {head[:9]}, clean tree) from ")
    again = _make_env(str(repo), tmp_path)
    assert again.returncode == 0 and f"make-env: {env.name} is up to date" in again.stdout
    # an uncommitted change: a fresh environment, named dirty with the content's hash, holding the changed file
    _edit(repo)
    try:
        changed = _make_env(str(repo), tmp_path)
        assert changed.returncode == 0, changed.stderr
        dirty = parse_bridge(str(repo))
        assert dirty.dirty and dirty.tag == f"g{head[:9]}.dirty.{dirty.content[:8]}"
        fresh = tmp_path / f".venv-bridge-0.6.2+{dirty.tag}"
        assert f"make-env: creating {fresh.name}" in changed.stdout
        assert (fresh / "bridge-src/megatron/bridge" / IN_PACKAGE).read_text() == (repo / QWEN3).read_text()
        assert "dirty tree" in candidate_line(json.loads((fresh / CANDIDATE_FILE).read_text()))
        assert env.is_dir()  # the clean tree's environment stays
    finally:
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", "--", "."], check=True)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_commit_and_wheel_candidates(history: History, tmp_path: Path) -> None:
    src = parse_bridge(f"{history.repo}@main~4")
    assert (src.kind, src.commit, src.subject) == ("commit", history.released, "release as pinned")
    env = build(plan(src), tmp_path / plan(src).name, BASE, note=lambda _: None)
    assert env.name == f".venv-bridge-0.6.2+g{history.released[:9]}"
    assert "megatron-bridge 0.6.2+g" in describe(env)
    # a wheel of the same files: installed into the environment's own site-packages, its version as built
    wheel = tmp_path / "megatron_bridge-0.6.3rc1-py3-none-any.whl"
    _write_wheel(wheel, history.repo / "src", "megatron_bridge", "0.6.3rc1")
    w = parse_bridge(str(wheel))
    built = build(plan(w), tmp_path / plan(w).name, BASE, note=lambda _: None)
    assert built.name == f".venv-bridge-0.6.3rc1+whl.{w.content[:8]}"
    assert "megatron-bridge 0.6.3rc1," in describe(built)
    assert list((built / "lib").glob("python*/site-packages/megatron/bridge/__init__.py"))
    assert "wheel sha256 " in candidate_line(json.loads((built / CANDIDATE_FILE).read_text()))


def _write_wheel(path: Path, root: Path, name: str, version: str) -> None:
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        for file in sorted((root / "megatron" / "bridge").rglob("*.py")):
            zf.write(file, str(file.relative_to(root)))
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")


def test_pins_default_to_the_nearest_release_and_overrides_name_the_env(history: History) -> None:
    assert nearest_release("0.7.0").bridge == "0.6.2"
    assert nearest_release("0.6.0rc0").bridge == "0.5.1" and nearest_release("0.6.1").bridge == "0.6.0"
    src = parse_bridge(f"{history.repo}@main")
    default = plan(src)
    assert default.base_stack() and default.stack() == ["megatron-core==0.19.2", "transformers==5.12.1",
                                                         "tokenizers==0.22.2"]  # fmt: skip
    older = plan(src, core="0.18.2", transformers="5.8.1")
    assert not older.base_stack() and older.name.endswith("-core0.18.2-tf5.8.1")
    assert plan(src, pins="0.5.1").stack()[:2] == ["megatron-core==0.18.2", "transformers==5.8.1"]


@pytest.mark.parametrize(
    "spec, line",
    [
        ("/nonexistent/repo@main", "make-env: error: not a folder: /nonexistent/repo"),
        ("{tmp}", "make-env: error: {tmp} is not a Megatron-Bridge source tree (no src/megatron/bridge/__init__.py)"),
        ("{repo}@nope", "make-env: error: unknown revision 'nope' in {repo}"),
        ("{tmp}@main", "make-env: error: not a git repository: {tmp}"),
        ("{tmp}/missing.whl", "make-env: error: {tmp}/missing.whl is not a megatron_bridge wheel file"),
    ],
)
def test_bad_candidates_are_one_line_and_exit_2(history: History, tmp_path: Path, spec: str, line: str) -> None:
    fill = {"tmp": str(tmp_path), "repo": str(history.repo)}
    out = tmp_path / "envs"
    out.mkdir()
    res = _make_env(spec.format(**fill), out)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [line.format(**fill)], res.stderr
    assert not list(out.iterdir())
    with pytest.raises(BadInput, match="not a megatron-core version"):
        plan(parse_bridge(str(history.repo)), core="latest!")


def test_gate_report_names_the_candidate(history: History, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from convcheck.cli.gate import gate_result
    from convcheck.gate.allow import triage

    _edit(history.repo)
    try:
        src = parse_bridge(str(history.repo))
    finally:
        subprocess.run(["git", "-C", str(history.repo), "checkout", "-q", "--", "."], check=True)
    (tmp_path / CANDIDATE_FILE).write_text(json.dumps({**plan(src).to_dict(), "env": str(tmp_path)}))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert candidate_info()["bridge"]["dirty"] is True
    result = gate_result([], triage([], [], []), tmp_path, 1.0)
    assert result["candidate"]["bridge"]["commit"] == history.fixed
    out = io.StringIO()
    print_gate(result, out=out)
    assert (f"candidate: megatron-bridge 0.6.2 (commit {history.fixed[:9]}, dirty tree) from {history.repo}; "
            "megatron-core 0.19.2, transformers 5.12.1 (pins of release 0.6.2)\n") in out.getvalue()  # fmt: skip
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "release-env"))
    assert gate_result([], triage([], [], []), tmp_path, 1.0)["candidate"] is None


def test_core_from_a_tree_comes_before_the_base_venv(history: History, tmp_path: Path) -> None:
    core = tmp_path / "Megatron-LM" / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "package_info.py").write_text("MAJOR = 0\nMINOR = 20\nPATCH = 0\nPRE_RELEASE = 'rc1'\n")
    p = plan(parse_bridge(f"{history.repo}@main"), core=str(core.parents[1]))
    assert (p.core.kind, p.core.version, p.stack()) == ("tree", "0.20.0rc1", ["transformers==5.12.1",
                                                                             "tokenizers==0.22.2"])  # fmt: skip
    assert p.name == f".venv-bridge-0.6.2+g{history.fixed[:9]}-core0.20.0rc1.tree.{p.core.content[:8]}"
    env = build(p, tmp_path / p.name, BASE, note=lambda _: None)
    pth = next((env / "lib").glob("python*/site-packages/zz-convcheck-candidate.pth")).read_text().splitlines()
    assert pth[:2] == [str(env / "bridge-src"), str(core.parents[1])] and pth[-1].endswith("site-packages")
    assert "megatron-core 0.20.0rc1+tree." in describe(env)
