"""The pytest plugin and convcheck.testing, used from a scratch project as another repository would (pytester)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from safetensors.torch import load_file, save_file

from convcheck.cache import cache_root
from convcheck.compare.bits import int_view
from convcheck.errors import BadInput
from convcheck.fixtures.build import build_fixture
from convcheck.layout import ParallelLayout
from convcheck.pytest_plugin import _adapter_options, _choose_layout, callable_spec
from convcheck.testing import assert_bitwise_equal, assert_same_checkpoint, assert_verdict_pass
from convcheck.verdict import Finding, OracleVerdict, Report
from tests.support.helpers import ROOT

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "convcheck.pytest_plugin")
SCRATCH_PYPROJECT = """
[project]
name = "scratch-trainer"
version = "0"

[tool.pytest.ini_options]
addopts = "--strict-markers -p no:cacheprovider"
"""


# ---------------------------------------------------------------------------------------------------------------
# convcheck.testing, in process


def _flip_bit(tensor: torch.Tensor, flat_index: int, bit: int = 0) -> torch.Tensor:
    """A copy of `tensor` with one bit of one element flipped."""
    out = tensor.clone()
    ints = int_view(out)  # shares storage with `out`
    ints[flat_index] ^= 1 << bit
    return out


def test_assert_bitwise_equal_names_tensor_index_values_and_bits() -> None:
    expected = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4) / 16
    assert_bitwise_equal(expected.clone(), expected, name="w")
    with pytest.raises(AssertionError) as caught:
        assert_bitwise_equal(_flip_bit(expected, 6), expected, name="model.norm.weight")
    message = str(caught.value)
    assert message.startswith("model.norm.weight: 1/12 elements differ; first at index [1, 2]: got ")
    assert "(0x3ec1)" in message and "expected 0.375 (0x3ec0)" in message


def test_assert_bitwise_equal_is_bitwise_not_numeric() -> None:
    zero = torch.zeros(4, dtype=torch.float32)
    with pytest.raises(AssertionError, match=r"z: 1/4 elements differ; first at index \[2\].*0x80000000"):
        assert_bitwise_equal(torch.tensor([0.0, 0.0, -0.0, 0.0]), zero, name="z")
    with pytest.raises(AssertionError, match="z: dtype bfloat16, expected float32"):
        assert_bitwise_equal(zero.bfloat16(), zero, name="z")
    with pytest.raises(AssertionError, match=r"z: shape \[2, 2\], expected \[4\]"):
        assert_bitwise_equal(zero.reshape(2, 2), zero, name="z")
    with pytest.raises(TypeError, match="actual must be a torch.Tensor"):
        assert_bitwise_equal([0.0], zero)


def _rewrite_tensor(folder: Path, name: str, change: Any) -> None:
    """Rewrite the shard holding `name` with change(tensor) (None drops it, and its index entry)."""
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    shard = folder / index["weight_map"][name]
    tensors = load_file(str(shard))
    new = change(tensors.pop(name))
    if new is None:
        del index["weight_map"][name]
        index_file.write_text(json.dumps(index))
    else:
        tensors[name] = new
    save_file(tensors, str(shard), metadata={"format": "pt"})


def _copy_checkpoint(source: Path, target: Path) -> Path:
    target.mkdir()
    for file in source.iterdir():
        if file.is_file() and not file.name.startswith("."):
            (target / file.name).write_bytes(file.read_bytes())
    return target


def test_assert_same_checkpoint_names_every_difference(tmp_path: Path) -> None:
    source = build_fixture("tiny:llama")
    assert_same_checkpoint(source, _copy_checkpoint(source, tmp_path / "same"))
    changed = _copy_checkpoint(source, tmp_path / "changed")
    _rewrite_tensor(changed, "model.layers.0.self_attn.o_proj.weight", lambda t: _flip_bit(t, 33, 3))
    _rewrite_tensor(changed, "model.layers.1.mlp.up_proj.weight", lambda t: t.float())
    _rewrite_tensor(changed, "model.norm.weight", lambda t: None)
    with pytest.raises(AssertionError) as caught:
        assert_same_checkpoint(source, changed)
    lines = str(caught.value).splitlines()
    assert lines[0].startswith("checkpoints differ in 3 place(s)")
    assert lines[1] == "  model.norm.weight: only in a"
    assert lines[2].startswith(
        "  model.layers.0.self_attn.o_proj.weight: 1/1024 elements differ; first at index [1, 1]"
    )
    assert lines[3] == "  model.layers.1.mlp.up_proj.weight: dtype float32, expected bfloat16"


def _report(*oracles: OracleVerdict) -> Report:
    return Report(
        model="tiny:llama", layout={"tp": 2, "pp": 1, "ep": 1, "etp": 1}, device="cpu", versions={}, oracles=oracles
    )


def test_assert_verdict_pass_lists_every_failing_oracle_and_finding() -> None:
    ok = OracleVerdict(name="coverage", checked=20)
    assert_verdict_pass(_report(ok))
    bad = OracleVerdict(
        name="roundtrip",
        checked=20,
        findings=(
            Finding(tensor="model.layers.0.self_attn.o_proj.weight", kind="bytes-differ", message="1/1024 differ"),
            Finding(tensor="lm_head.weight", kind="dtype", message="dtype float32, expected bfloat16"),
        ),
    )
    idle = OracleVerdict(name="mapping", checked=0)
    with pytest.raises(AssertionError) as caught:
        assert_verdict_pass(_report(ok, bad, idle))
    assert str(caught.value).splitlines() == [
        "convcheck verify tiny:llama at TP2: FAIL (2 of 3 oracles failed)",
        "  roundtrip: 2 finding(s), checked 20 tensors",
        "    model.layers.0.self_attn.o_proj.weight [bytes-differ] 1/1024 differ",
        "    lm_head.weight [dtype] dtype float32, expected bfloat16",
        "  mapping: checked 0 tensors and found nothing (an oracle must check)",
    ]
    with pytest.raises(AssertionError, match="roundtrip: 2 finding"):
        assert_verdict_pass(_report(bad).to_dict())  # the JSON form `convcheck verify --json` writes
    with pytest.raises(AssertionError, match="no oracle ran"):
        assert_verdict_pass(_report())


# ---------------------------------------------------------------------------------------------------------------
# plugin internals and packaging, in process


def module_level_function(ctx: Any) -> int:
    """A rank function the plugin can hand to the ranks by name."""
    return ctx.rank


def test_rank_functions_must_be_importable_by_name() -> None:
    assert callable_spec(module_level_function) == f"{Path(__file__).resolve()}:module_level_function"
    assert callable_spec("pkg.mod:fn") == "pkg.mod:fn"
    with pytest.raises(BadInput, match="cannot be a lambda"):
        callable_spec(lambda ctx: 0)
    scale = 2

    def closure(ctx: Any) -> int:
        return ctx.rank * scale

    with pytest.raises(
        BadInput, match="test_rank_functions_must_be_importable_by_name.<locals>.closure is not defined"
    ):
        callable_spec(closure)
    with pytest.raises(BadInput, match="must be a module-level function"):
        callable_spec(print)


def test_layout_choice_and_adapter_support() -> None:
    tp2 = ParallelLayout(tp=2)
    assert _choose_layout(None, {"tp": 1}, None, ParallelLayout()) == ParallelLayout()
    assert _choose_layout(None, {"tp": 1}, tp2, ParallelLayout()) == tp2
    assert _choose_layout("pp2", {}, tp2, ParallelLayout()) == ParallelLayout(pp=2)
    assert _choose_layout(None, {"tp": 2, "ep": 2}, tp2, ParallelLayout()) == ParallelLayout(tp=2, ep=2)
    with pytest.raises(BadInput, match="not both"):
        _choose_layout("tp2", {"ep": 2}, None, ParallelLayout())

    assert _adapter_options(sender=None, receiver=None) == {}
    assert _adapter_options(sender="bucketed", receiver="hf") == {"sender": "bucketed", "receiver": "hf"}


def test_verify_fixture_passes_reshard_targets(convcheck_verify: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """target_tp / target_ep / target_etp (one size or several each) reach the prepared job; api.run is captured, so
    nothing launches."""
    from convcheck import api

    jobs: list[Any] = []
    monkeypatch.setattr(api, "run", lambda job, **_: jobs.append(job) or "report")
    targets = {"target_tp": [1, 4], "target_ep": 2, "target_etp": [1, 2]}
    assert convcheck_verify("tiny:qwen3-moe", "tp2ep2", oracles="reshard", device="cpu", **targets) == "report"
    assert (jobs[0].targets.tps, jobs[0].targets.eps, jobs[0].targets.etps) == ((1, 4), (2,), (1, 2))
    with pytest.raises(BadInput, match="used only by the reshard oracle"):
        convcheck_verify("tiny:qwen3", oracles="coverage", device="cpu", target_ep=[1, 2])


def test_importing_the_plugin_loads_no_heavy_module() -> None:
    """The plugin loads into every pytest process: no torch until a test uses an assertion that takes tensors."""
    code = (
        "import sys, convcheck.pytest_plugin as p; "
        "heavy = ('torch', 'megatron', 'transformers', 'safetensors'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy)); "
        "print(p.assert_bitwise_equal.__module__, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip().splitlines() == ["[]", "convcheck.testing True"]


def _entry_points() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]


def test_entry_point_is_declared() -> None:
    assert _entry_points() == {"convcheck": "convcheck.pytest_plugin"}


# ---------------------------------------------------------------------------------------------------------------
# a scratch project, run in a pytest subprocess


@pytest.fixture
def scratch(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A conftest-free project with its own pyproject.toml; convcheck's fixture cache is the shared one."""
    pytester.makepyprojecttoml(SCRATCH_PYPROJECT)
    monkeypatch.setenv("CONVCHECK_CACHE_DIR", str(cache_root().resolve()))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # `-p` names every plugin, whatever is installed
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("COLUMNS", "240")
    return pytester


def test_entry_point_loads_the_plugin(scratch: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed metadata carrying pyproject's pytest11 table makes pytest load the plugin with no `-p`."""
    dist = scratch.path / "site" / "convcheck_entry_point_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: convcheck-entry-point-probe\nVersion: 0\n")
    table = "".join(f"{name} = {target}\n" for name, target in _entry_points().items())
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{table}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(dist.parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    scratch.makepyfile(
        """
        import pytest
        from convcheck.layout import ParallelLayout

        @pytest.mark.convcheck(model="tiny:llama")
        def test_fixture_is_there(convcheck_layout, request):
            assert convcheck_layout == ParallelLayout()
            assert request.config.pluginmanager.has_plugin("convcheck")
        """
    )
    scratch.runpytest_subprocess(timeout=120).assert_outcomes(passed=1)


def test_markers_are_registered_and_bad_input_is_one_line(scratch: pytest.Pytester) -> None:
    scratch.makepyfile(
        test_unknown_model="""
        import pytest

        @pytest.mark.convcheck(model="tiny:nope")
        def test_unknown_model(convcheck_checkpoint):
            pass
        """,
        test_bad_layout="""
        import pytest

        @pytest.mark.convcheck_layouts("tq2")
        def test_bad_layout(convcheck_layout):
            pass
        """,
    )
    markers = scratch.runpytest_subprocess(*PLUGIN, "--markers", timeout=120)
    markers.stdout.fnmatch_lines(
        ["@pytest.mark.convcheck(model): *default tiny:qwen3*", "@pytest.mark.convcheck_layouts(*layouts): *"]
    )
    result = scratch.runpytest_subprocess(*PLUGIN, "test_unknown_model.py", timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["BadInput: unknown fixture 'tiny:nope'; known: tiny:qwen2*"])
    assert "Traceback" not in result.stdout.str() and "def test_unknown_model" not in result.stdout.str()
    collected = scratch.runpytest_subprocess(*PLUGIN, "test_bad_layout.py", timeout=120)
    collected.stdout.fnmatch_lines(["*test_bad_layout: convcheck_layouts: layout 'tq2' is not of the form*"])
    assert collected.ret == pytest.ExitCode.INTERRUPTED  # a collection error stops the session
    assert "During handling" not in collected.stdout.str() and "Traceback" not in collected.stdout.str()


def test_fixtures_markers_and_helpers(scratch: pytest.Pytester) -> None:
    """Checkpoint fixture (default, marker, indirect), the layouts marker skipping an illegal layout, the helpers."""
    scratch.makepyfile(
        """
        import json

        import pytest
        from safetensors.torch import load_file
        from convcheck.compare.bits import int_view
        from convcheck.pytest_plugin import assert_bitwise_equal, assert_same_checkpoint

        def test_default_checkpoint(convcheck_checkpoint):
            assert convcheck_checkpoint.name.startswith("qwen3-") and (convcheck_checkpoint / "config.json").is_file()
            assert_same_checkpoint(convcheck_checkpoint, convcheck_checkpoint)

        @pytest.mark.convcheck(model="tiny:qwen3-moe")
        def test_marker_model(convcheck_checkpoint):
            assert convcheck_checkpoint.name.startswith("qwen3-moe-")

        @pytest.mark.parametrize("convcheck_checkpoint", ["tiny:llama"], indirect=True)
        def test_indirect_model(convcheck_checkpoint):
            assert convcheck_checkpoint.name.startswith("llama-")

        @pytest.mark.convcheck_layouts("tp1", "tp2", "ep2")
        def test_layouts(convcheck_layout):
            assert convcheck_layout.spec in ("tp1", "tp2")

        @pytest.mark.convcheck(model="tiny:qwen3-moe")
        @pytest.mark.convcheck_layouts("ep2", "tp2ep2")
        def test_moe_layouts(convcheck_layout):
            assert convcheck_layout.ep == 2

        def test_flipped_bit(convcheck_checkpoint):
            index = json.loads((convcheck_checkpoint / "model.safetensors.index.json").read_text())
            shard = convcheck_checkpoint / index["weight_map"]["model.norm.weight"]
            tensor = load_file(str(shard))["model.norm.weight"]
            flipped = tensor.clone()
            int_view(flipped)[3] ^= 1
            assert_bitwise_equal(flipped, tensor, name="model.norm.weight")
        """
    )
    result = scratch.runpytest_subprocess(*PLUGIN, "-rs", "-v", timeout=300)
    result.assert_outcomes(passed=7, failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*test_layouts?tp1? PASSED*",
            "*test_layouts?tp2? PASSED*",
            "*test_layouts?ep2? SKIPPED*",
            "*test_moe_layouts?tp2ep2? PASSED*",
            "E *AssertionError: model.norm.weight: 1/32 elements differ; "
            "first at index [[]3[]]: got * (0x*), expected *",
            "SKIPPED * layout ep2 is illegal for tiny:qwen3: impossible layout EP2: the model has no experts*",
        ]
    )


BUILD_WHEN_BOTH_READY = """
import pathlib, sys, time
import torch, transformers
from convcheck.fixtures.build import build_fixture

ready = pathlib.Path(sys.argv[1])
(ready / sys.argv[2]).touch()
while len(list(ready.iterdir())) < 2:
    time.sleep(0.002)
print(build_fixture("tiny:llama"))
"""


def test_concurrent_builds_of_one_fixture_build_it_once(tmp_path: Path) -> None:
    """Two processes released together build tiny:llama into one empty cache: one staging folder ever, one result."""
    env = {**os.environ, "CONVCHECK_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    (tmp_path / "ready").mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD_WHEN_BOTH_READY, str(tmp_path / "ready"), str(i)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    staging: set[str] = set()
    fixtures = tmp_path / "cache" / "fixtures"
    while any(p.poll() is None for p in procs):
        if fixtures.is_dir():
            staging |= {p.name for p in fixtures.iterdir() if p.is_dir() and p.name.startswith(".llama-")}
        time.sleep(0.002)
    outs = {p.communicate()[0].strip() for p in procs}
    assert [p.returncode for p in procs] == [0, 0]
    assert len(outs) == 1, outs
    folder = Path(outs.pop())
    assert (folder / ".complete").is_file()
    assert len(staging) == 1, f"staging folders seen: {sorted(staging)}"
    assert [p.name for p in fixtures.iterdir() if p.is_dir()] == [folder.name]


# ---------------------------------------------------------------------------------------------------------------
# real rank launches from the scratch project

RANK_FUNCTIONS = """
import os


def mlp_shards(ctx, prefix):
    mine = {name: list(t.shape) for name, t in ctx.named_parameters() if name.startswith(prefix)}
    return {"world": ctx.world, "shards": ctx.gather((ctx.coord.tp_rank, mine))}


def where(ctx):
    return {"world": ctx.world, "model": str(ctx.checkpoint.path), "pid": os.getpid()}
"""


@pytest.mark.ranks
def test_verify_and_rank_functions_from_another_repo(scratch: pytest.Pytester) -> None:
    """A passing layouts-marked verify (an illegal layout skipped), a planted bug named by tensor, a rank function."""
    scratch.makepyfile(
        RANK_FUNCTIONS
        + """
import pytest
from convcheck.testing import assert_verdict_pass


@pytest.mark.convcheck(model="tiny:qwen3")
@pytest.mark.convcheck_layouts("tp2", "ep2")
def test_roundtrip(convcheck_verify, convcheck_layout):
    report = convcheck_verify(oracles="coverage,roundtrip")
    assert report.layout["tp"] == convcheck_layout.tp == 2
    assert_verdict_pass(report)


def test_planted_bug(convcheck_verify):
    report = convcheck_verify(
        "tiny:llama", oracles=["coverage", "roundtrip"], hooks=["convcheck.mutants.bridge:transpose_o_proj"]
    )
    assert_verdict_pass(report)


def test_rank_function(convcheck_ranks):
    out = convcheck_ranks(mlp_shards, prefix="decoder.layers.0.mlp")
    assert out["world"] == 2 and [tp for tp, _ in out["shards"]] == [0, 1]
    for _, shapes in out["shards"]:
        assert shapes == {  # the TE layout verify builds by default: the pre-MLP norm lives in linear_fc1
            "decoder.layers.0.mlp.linear_fc1.layer_norm_weight": [32],
            "decoder.layers.0.mlp.linear_fc1.weight": [64, 32],
            "decoder.layers.0.mlp.linear_fc2.weight": [32, 32],
        }
"""
    )
    result = scratch.runpytest_subprocess(*PLUGIN, "-rs", "-v", timeout=600)
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*test_roundtrip?tp2? PASSED*",
            "*test_roundtrip?ep2? SKIPPED*",
            "*test_planted_bug FAILED*",
            "*test_rank_function PASSED*",
            "E *AssertionError: convcheck verify tiny:llama at TP1: FAIL (1 of 2 oracles failed)",
            "E *  roundtrip: 1 finding(s), checked * tensors",
            "E *    model.layers.0.self_attn.o_proj.weight [[]bytes-differ[]] *",
        ]
    )


@pytest.mark.ranks
def test_two_xdist_workers_share_a_fresh_fixture_and_launch_at_once(
    scratch: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CONVCHECK_CACHE_DIR", str(tmp_path / "fresh-cache"))
    scratch.makepyfile(
        RANK_FUNCTIONS
        + """
import pytest


@pytest.mark.convcheck(model="tiny:llama")
@pytest.mark.parametrize("n", [0, 1])
def test_tp1(convcheck_ranks, convcheck_checkpoint, n):
    out = convcheck_ranks(where, "tp1")
    assert out["world"] == 1 and out["model"] == str(convcheck_checkpoint)
"""
    )
    result = scratch.runpytest_subprocess(*PLUGIN, "-n", "2", "-p", "xdist", "-v", timeout=600)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines_random(["*gw0*PASSED*test_tp1*", "*gw1*PASSED*test_tp1*"])
    fixtures = tmp_path / "fresh-cache" / "fixtures"
    assert [p.name.split("-")[0] for p in fixtures.iterdir() if not p.name.startswith(".")] == ["llama"]
    assert not [p for p in fixtures.iterdir() if p.is_dir() and p.name.startswith(".")]


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default, so Python installs KeyboardInterrupt for it (a process
    started with SIGINT ignored, as `cmd &` in a non-interactive shell is, keeps it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ranks_under(folder: Path) -> dict[int, list[str]]:
    """pid -> command line of live processes naming a path under `folder` (torchrun and the convcheck ranks)."""
    out = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.pid != os.getpid() and any(str(folder) in part for part in cmdline):
            out[proc.pid] = cmdline
    return out


def _workers(folder: Path) -> int:
    return sum("convcheck.engine.worker" in cmdline for cmdline in _ranks_under(folder).values())


INTERRUPTED = """
import os, signal, threading, time
import psutil, pytest


def rank_started():
    for proc in psutil.Process().children(recursive=True):
        try:
            if "convcheck.engine.worker" in proc.cmdline():
                return True
        except psutil.Error:
            pass
    return False


def test_interrupted(convcheck_verify):
    if os.environ["SCRATCH_HOW"] == "exception":  # what pytest-timeout's signal method does

        def on_alarm(signum, frame):
            pytest.fail("simulated test timeout")

        def alarm_once_ranks_run():
            while not rank_started():
                time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGALRM)

        signal.signal(signal.SIGALRM, on_alarm)
        threading.Thread(target=alarm_once_ranks_run, daemon=True).start()
    convcheck_verify("tiny:qwen3", "tp2", oracles="coverage")
"""


@pytest.mark.ranks
@pytest.mark.torchrun  # finds the ranks by command line (the same stop under warm ranks: tests/test_everyday.py)
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "exception"])
def test_no_rank_outlives_an_interrupted_test(scratch: pytest.Pytester, tmp_path: Path, how: str) -> None:
    scratch.makepyfile(test_interrupted=INTERRUPTED)
    basetemp = tmp_path / "basetemp"
    args = [sys.executable, "-m", "pytest", *PLUGIN, f"--basetemp={basetemp}", "test_interrupted.py"]
    with (tmp_path / "out.txt").open("w") as log:
        proc = subprocess.Popen(
            args,
            cwd=scratch.path,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SCRATCH_HOW": how},
            preexec_fn=_default_sigint,  # a runner started in the background (`make test &`) ignores SIGINT
        )
        deadline = time.monotonic() + 240
        while how != "exception" and _workers(basetemp) < 2:  # the exception case raises once its ranks run
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "out.txt").read_text()
            time.sleep(0.1)
        if how != "exception":
            proc.send_signal(getattr(signal, how))
        code = proc.wait(timeout=120)
    leftovers: dict[int, list[str]] = {}
    for _ in range(40):  # the launcher gives torchrun 10 s to stop its ranks
        leftovers = _ranks_under(basetemp)
        if not leftovers:
            break
        time.sleep(0.5)
    output = (tmp_path / "out.txt").read_text()
    assert not leftovers, f"left running: {list(leftovers.values())}\n{output}"
    expected = {"SIGINT": 2, "SIGTERM": -signal.SIGTERM, "exception": 1}[how]
    assert code == expected, output
    if how == "exception":
        assert "simulated test timeout" in output
