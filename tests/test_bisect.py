"""`convcheck bisect` over a synthetic Megatron-Bridge history (the pinned bridge's files, a planted conversion change,
a commit that does not import, an unrelated one) and `make env BRIDGE=<work tree>` from it; bad input; the picking of
the commits to test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from convcheck.workflows.bisect import _picks
from tests.support.bridge_history import History, make_history
from tests.support.helpers import ROOT, run_cli

CASE = "qwen3/tp1"
SUBJECT = "qwen3: planted conversion change (q_norm and k_norm swapped)"


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return make_history(tmp_path_factory.mktemp("bridge") / "Megatron-Bridge")


def _env(tmp: Path) -> dict[str, str]:
    return {"CONVCHECK_BASE_VENV": sys.prefix, "CONVCHECK_ENV_DIR": str(tmp)}


@pytest.mark.ranks
def test_bisect_names_the_planted_commit_and_skips_the_broken_one(history: History, tmp_path: Path) -> None:
    res = run_cli("bisect", "--bridge-repo", str(history.repo), "--good", history.released, "--bad", "main",
                  "--case", CASE, "--env-dir", str(tmp_path / "envs"), env=_env(tmp_path), timeout=600)  # fmt: skip
    assert res.code == 0, res.out + res.err
    out = res.out.splitlines()
    assert f"FOUND first bad commit {history.planted} {SUBJECT}" in out
    found = out.index(f"FOUND first bad commit {history.planted} {SUBJECT}")
    diffs = [line.strip() for line in out[found + 1 :] if line.startswith("  ")]
    assert "decoder.layers.0.self_attention.q_layernorm.weight: [hf-names-changed]" in "\n".join(diffs), diffs
    assert any(line.startswith("mapping: [verdict-regression]") for line in diffs), diffs
    skipped = [line for line in out if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and skipped[0].startswith(f"SKIPPED {history.broken[:9]} refactor: an import that fails: ")
    assert "planted: this commit does not import" in skipped[0]
    assert out[-1].startswith("bisect: 4 commit(s) after good, 4 tested (1 skipped), pins of release 0.6.2, ")
    steps = [line for line in res.err.splitlines() if line.startswith("bisect: step ")]
    assert [s.split()[3:5] for s in steps] == [
        [history.released[:9], "good:"],
        [history.fixed[:9], "bad:"],
        [history.broken[:9], "skip:"],
        [history.planted[:9], "bad:"],
    ], steps
    # the per-commit environments are cached: one per tested commit, none half-made
    envs = sorted(p.name for p in (tmp_path / "envs").iterdir())
    assert len(envs) == 4 and all(n.startswith(".venv-bridge-0.6.2+g") for n in envs), envs


@pytest.mark.ranks
def test_make_env_from_the_work_tree_gates_like_a_release(history: History, tmp_path: Path) -> None:
    env = {**os.environ, **_env(tmp_path)}
    made = subprocess.run(["make", "-s", "-C", str(ROOT), "env", f"BRIDGE={history.repo}"], capture_output=True,
                          text=True, env=env, check=False)  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    convcheck = tmp_path / f".venv-bridge-0.6.2+g{history.fixed[:9]}" / "bin" / "convcheck"
    env.pop("CONVCHECK_WARM_SOCKET", None)
    report = tmp_path / "gate.json"
    res = subprocess.run([str(convcheck), "gate", "check", "--case", CASE, "--json", str(report)], capture_output=True,
                         text=True, env=env, check=False, timeout=600)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    differences = json.loads(report.read_text())["cases"][0]["differences"]
    assert sorted((d["kind"], d["subject"]) for d in differences) == [
        *[
            ("hf-names-changed", f"decoder.layers.{n}.self_attention.{x}_layernorm.weight")
            for n in (0, 1)
            for x in "kq"
        ],
        ("verdict-regression", "logits"),
        ("verdict-regression", "mapping"),
    ]
    assert (
        "FAIL 2 names like decoder.layers.0.self_attention.q_layernorm.weight: [hf-names-changed] HF names "
        "model.layers.0.self_attn.q_norm.weight -> model.layers.0.self_attn.k_norm.weight  [qwen3/tp1]"
    ) in res.stdout
    assert (f"candidate: megatron-bridge 0.6.2 (commit {history.fixed[:9]}, clean tree) from {history.repo}; "
            "megatron-core 0.19.2, transformers 5.12.1 (pins of release 0.6.2)") in res.stdout  # fmt: skip
    assert f"now: megatron-core 0.19.2 megatron-bridge 0.6.2+g{history.fixed[:9]} transformers 5.12.1" in res.stdout


@pytest.mark.parametrize(
    "args, line",
    [
        (["--bridge-repo", "{tmp}", "--good", "a", "--bad", "b", "--case", CASE], "not a git repository: {tmp}"),
        (["--good", "nope", "--bad", "main", "--case", CASE], "unknown revision 'nope' in {git}"),
        (["--good", "main", "--bad", "main~4", "--case", CASE], "good main is not an ancestor of bad main~4"),
        (["--good", "main~4", "--bad", "main", "--case", "qwen9/tp1"], "unknown gate case 'qwen9/tp1'; known: "),
        (["--good", "main~4", "--bad", "main"], "give one of --case ID or --verify 'ARGS'"),
        (["--good", "main~4", "--bad", "main", "--case", CASE, "--verify", "--model tiny:qwen3"],
         "give one of --case ID or --verify 'ARGS'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(history: History, tmp_path: Path, args: list[str], line: str) -> None:
    if "--bridge-repo" not in args:
        args = ["--bridge-repo", str(history.repo), *args]
    res = run_cli("bisect", *[a.format(tmp=tmp_path) for a in args], "--env-dir", str(tmp_path / "envs"),
                  env=_env(tmp_path))  # fmt: skip
    want = line.format(tmp=tmp_path, git=history.repo / ".git")
    assert res.code == 2 and len(res.err.splitlines()) == 1, res.err
    assert res.err.startswith(f"convcheck: error: {want}"), res.err
    assert not (tmp_path / "envs").exists() or not list((tmp_path / "envs").iterdir())


def test_picks_halve_the_range_and_jump_over_skipped_runs() -> None:
    assert _picks(-1, 4, {4}, set(), 1) == [1]  # 0..3 untested: the lower middle
    assert _picks(-1, 4, {4}, set(), 2) == [1, 2]  # --jobs 2: thirds
    assert _picks(0, 1, {0, 1}, set(), 1) == []  # nothing left between good and bad
    # a run of skipped commits around the middle: each skip doubles the distance kept from them
    skipped = {50, 51, 49}
    pick = _picks(-1, 100, {100, *skipped}, skipped, 1)[0]
    assert min(abs(pick - s) for s in skipped) > 7, pick
    assert _picks(-1, 3, {3, 1}, {1}, 1) == [0]  # only neighbours of the skip are left: take one anyway


def test_verify_mode_classifies_by_exit_code(history: History, tmp_path: Path) -> None:
    """--verify: exit 0 good, 1 bad (its last report lines kept), anything else skip (its last stderr line)."""
    from convcheck.workflows.bisect import Runner, Spec
    from convcheck.workflows.candidate import bridge_commit

    fake = tmp_path / "env"
    (fake / "bin").mkdir(parents=True)
    script = fake / "bin" / "convcheck"
    src = bridge_commit(history.repo, "main")
    runner = Runner(Spec(repo=str(history.repo), good="a", bad="b", verify=("--model", "tiny:qwen3")), "", "0.6.2",
                    tmp_path)  # fmt: skip
    for code, state, why in ((0, "good", "verify exit 0"), (1, "bad", "verify exit 1"), (2, "skip", "verify did not "
                             "run: convcheck: error: no such model")):  # fmt: skip
        script.write_text(
            f"#!/bin/sh\necho 'FAIL roundtrip'\necho 'convcheck: error: no such model' >&2\nexit {code}\n"
        )
        script.chmod(0o755)
        step = runner._verify(fake, src, 0.0)
        assert (step.state, step.why, step.commit) == (state, why, history.fixed)
        assert step.differences == (("FAIL roundtrip",) if state == "bad" else ())


@pytest.mark.fresh_process
def test_fla_stand_in_hook_lets_the_bridge_import_and_nothing_else() -> None:
    """examples/bisect_hooks.py:stub_fla (the real bisect's hook): `from fla.modules import ...` works, building one
    raises, every other fla import fails as without fla, and transformers still reports fla missing."""
    code = """
import importlib.util, runpy, sys
assert importlib.util.find_spec("fla") is None, "the real fla is installed: nothing to check"
runpy.run_path("examples/bisect_hooks.py")
from fla.modules import FusedRMSNormGated, ShortConvolution
try:
    ShortConvolution(8)
except ImportError as exc:
    print("built:", exc)
for name in ("fla.ops.gated_delta_rule", "fla.modules.l2norm", "fla.utils"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        print("missing:", name)
from transformers.utils.import_utils import is_flash_linear_attention_available
print("transformers sees fla:", is_flash_linear_attention_available())
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "built: flash-linear-attention is not installed (stand-in from examples/bisect_hooks.py)",
        "missing: fla.ops.gated_delta_rule",
        "missing: fla.modules.l2norm",
        "missing: fla.utils",
        "transformers sees fla: False",
    ]
