"""Older Megatron-Bridge releases (convcheck/gate/releases.toml, `make env BRIDGE=X`).

Fast checks, in every environment: the release table, the feature detection the compat shims use, the fixtures'
stored layouts and bytes, and that this environment's transformers loads every fixture its release supports.
`make test-release BRIDGE=X` runs this file in `.venv-bridge-X` with CONVCHECK_RELEASE_SMOKE=1, which adds the release
smoke: `convcheck verify` of tiny:qwen3 and tiny:qwen3-moe at TP1 and TP2 and of the DeepSeek-V3 family's fixtures at
TP1, every oracle, against the release's recorded findings (`smoke` in the table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

from convcheck.boot import imports_te_unconditionally

import pytest

from convcheck import compat
from convcheck.compat.detect import hybrid_stack, optional_module
from convcheck.compat.provider import builds_legacy_grouped_mlp, configure_hybrid_provider, hybrid_spec_field
from convcheck.errors import BadInput
from convcheck.fixtures import FIXTURES, get_spec
from convcheck.fixtures.build import build_fixture
from convcheck.fixtures.reference import (
    REFERENCE_TRANSFORMERS,
    derive_layout,
    folder_digests,
    load_layout,
    stored_digests,
)
from convcheck.gate.release_table import current_release, get_release, load_releases
from convcheck.layout import ParallelLayout
from tests.support.helpers import ROOT, run_cli, shared_value
from tests.support.release_targets import on_current_pins, release_label

RELEASES = load_releases()
INSTALLED = metadata.version("megatron-bridge")
SMOKE = os.environ.get("CONVCHECK_RELEASE_SMOKE") == "1"
SMOKE_CASES = (
    "qwen3@tp1", "qwen3@tp2", "qwen3-moe@tp1", "qwen3-moe@tp2", "deepseek-v3@tp1", "moonlight@tp1", "glm4.7-flash@tp1",
    "qwen3-next@tp1", "qwen3.5@tp1", "qwen3.5-moe@tp1", "mistral@tp1", "mistral-nowindow@tp1", "gpt-oss@tp1",
    "gpt-oss-2f-hidden@tp1", "glm4.5@tp1+te-grouped", "olmoe@tp2+te-grouped",
    "qwen2-tied@tp2:save", "qwen3-moe@tp2ep2:save", "llama@pp2:save", "deepseek-v3@tp1:save",
    "qwen2-tied-4l@pp2vpp2", "qwen3-moe-4l@pp2vpp2ep2", "qwen2-tied-4l@pp2first1last3",
    "qwen3@tp2+te", "qwen3-moe@tp2ep2+te", "llama@pp2+te", "deepseek-v3@tp1+te",
    "gemma3@tp1+te", "minimax-m2@tp1+te", "qwen3-vl@tp1+te", "qwen3-vl-moe@tp1+te", "glm5@tp1+te", "gemma4@tp1+te",
    "gemma4-moe@tp1+te", "qwen3.5-vl@tp1+te", "qwen3.5-vl-moe@tp1+te", "nemotron-3-mtp@tp1+te",
    "gemma3-vl@tp1+te", "gemma4-vl@tp1+te", "gemma4-vl-moe@tp1+te",
)  # fmt: skip
"""FIXTURE@LAYOUT[+te][+EXPERTS][:ORACLES]: LAYOUT as `ParallelLayout.parse` reads it (tp2, pp2, tp2ep2); +te builds
the bridge's Transformer Engine specs (on convcheck's stand-in; without it, the local spec the older rows were recorded
in); EXPERTS an --experts value; ORACLES a comma list run instead of the default set (the opt-in save oracle: the
bridge's own HF writer on that release). Each run stops hung ranks after 240 s (a release that hangs names it as
{exit-2 = "ranks did not finish"})."""
STOPS = "exit-2"
"""A smoke entry `{exit-2 = "..."}`: the release cannot build the fixture; verify stops with exit 2 saying that."""


INSTALLED_SHIMS = """
import importlib.util, json, pathlib
import torch
from convcheck import compat
from convcheck.boot import TE_IMPORTERS, imports_te_unconditionally, te_stand_in_modules
compat.install("cpu")
from megatron.bridge import AutoBridge
from megatron.core.transformer.moe import moe_utils
want = [m for m in TE_IMPORTERS if importlib.util.find_spec(m)
        and imports_te_unconditionally(pathlib.Path(importlib.util.find_spec(m).origin).read_text())]
x, w = torch.randn(3, 4, dtype=torch.bfloat16), torch.randn(5, 4, dtype=torch.bfloat16)
out = moe_utils.router_gating_linear(x, w, None, torch.float32)
exact = torch.mm(x.float(), w.float().t())
print(json.dumps({"stand_ins": sorted(te_stand_in_modules()), "te_importers": sorted(want),
                  "skipped": sorted(compat.skipped()),
                  "gating": out.dtype == torch.float32
                            and torch.equal(out.view(torch.int32), exact.view(torch.int32))}))
"""
"""One fresh interpreter that installs the CPU shims and imports the bridge, for the tests that read what it then
holds (the TE stand-ins, the skipped shims, the router gating): one import of megatron instead of one per test."""


@pytest.fixture
def installed(shared_root: Path) -> dict:
    return shared_value(shared_root, "releases-installed", _installed)


def _installed() -> dict:
    res = _run(INSTALLED_SHIMS)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, check=False
    )


# ---- the release table ---------------------------------------------------------------------------------------------


def test_table_lists_the_pypi_releases_with_their_megatron_core_pins() -> None:
    """The 3rdparty/Megatron-LM pin of each bridge tag (shared/cpu-facts.md, 'Real release pairs')."""
    core = {r.bridge: r.megatron_core for r in RELEASES.values()}
    assert core == {
        "0.3.0": "0.16.0", "0.3.1": "0.16.1", "0.4.0": "0.17.0", "0.4.1": "0.17.0", "0.4.2": "0.17.1",
        "0.5.0": "0.18.0", "0.5.1": "0.18.2", "0.6.0": "0.19.0", "0.6.2": "0.19.2",
    }  # fmt: skip
    lock = {r.bridge: r.transformers for r in RELEASES.values()}
    assert lock == {
        **dict.fromkeys(("0.3.0", "0.3.1"), "4.57.6"), **dict.fromkeys(("0.4.0", "0.4.1", "0.4.2"), "5.3.0"),
        **dict.fromkeys(("0.5.0", "0.5.1"), "5.8.1"), **dict.fromkeys(("0.6.0", "0.6.2"), "5.12.1"),
    }  # fmt: skip
    assert all(len(r.core_pin) == 40 for r in RELEASES.values() if r.bridge != current_release())


def test_current_release_is_the_current_pins() -> None:
    pins = (ROOT / "requirements" / "pins.txt").read_text() + (ROOT / "requirements" / "no-deps.txt").read_text()
    row = get_release(current_release())
    for line in row.requirements()[:3]:
        assert f"\n{line}\n" in f"\n{pins}\n", f"{line} is not in requirements/pins.txt or no-deps.txt"


def test_extras_are_what_each_release_imports() -> None:
    """modelopt where auto_bridge imports it at module level (0.4.x, 0.5.x); huggingface_hub < 1 for 4.57."""
    for row in RELEASES.values():
        names = {extra.split("==")[0] for extra in row.extras}
        assert ("nvidia-modelopt" in names) == row.bridge.startswith(("0.4.", "0.5.")), row.bridge
        assert ("huggingface_hub" in names) == row.transformers.startswith("4."), row.bridge
        assert all("==" in extra for extra in row.extras), row.bridge
        assert set(row.unsupported) <= set(FIXTURES), row.bridge
        assert {case.partition("@")[0] for case in row.smoke} <= set(FIXTURES), row.bridge
    assert get_release("0.5.1").requirements()[:4] == [
        "megatron-core==0.18.2", "megatron-bridge==0.5.1", "transformers==5.8.1", "tokenizers==0.22.2"
    ]  # fmt: skip


def test_unknown_release_is_bad_input_of_one_line() -> None:
    with pytest.raises(BadInput, match=r"unknown bridge release '9\.9'; known: 0\.3\.0, "):
        get_release("9.9")
    cmd = [sys.executable, "-m", "convcheck.gate.release_table", "requirements", "9.9"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_make_env_refuses_an_unknown_release_or_base_with_one_line(tmp_path: Path) -> None:
    script = str(ROOT / "scripts" / "make-env.sh")
    env = {**os.environ, "CONVCHECK_BASE_VENV": sys.prefix}
    res = subprocess.run(["bash", script, "9.9"], capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"error: unknown bridge release '9.9'; known: {', '.join(RELEASES)}"
    ]
    assert not (ROOT / ".venv-bridge-9.9").exists()
    env["CONVCHECK_BASE_VENV"] = str(tmp_path / "none")
    res = subprocess.run(["bash", script, "0.5.1"], capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "has no bin/python" in res.stderr


# ---- feature detection ---------------------------------------------------------------------------------------------


def test_te_import_detection_reads_module_level_imports_only() -> None:
    assert imports_te_unconditionally("import torch\nimport transformer_engine.pytorch as te\n")
    assert imports_te_unconditionally("from transformer_engine.pytorch import Linear\n")
    assert not imports_te_unconditionally("try:\n    import transformer_engine\nexcept ImportError:\n    pass\n")
    assert not imports_te_unconditionally("def f():\n    import transformer_engine\n")
    assert not imports_te_unconditionally("import transformer_engine_extras\n")


@pytest.mark.fresh_process
def test_shim1_wraps_exactly_the_modules_that_import_te(installed: dict) -> None:
    assert installed["stand_ins"] == installed["te_importers"] and installed["te_importers"], installed
    if INSTALLED.startswith(("0.3.", "0.4.", "0.5.")):
        assert "megatron.bridge.peft.lora" in installed["stand_ins"], installed


def test_optional_module_tells_absent_from_broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "convcheck_broken_probe.py").write_text("import convcheck_dependency_that_is_missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert optional_module("convcheck_no_such_module.sub") is None
    with pytest.raises(ModuleNotFoundError, match="convcheck_dependency_that_is_missing"):
        optional_module("convcheck_broken_probe")


def test_hybrid_stack_is_this_megatron_core_s() -> None:
    found = hybrid_stack()
    assert found is not None
    minor = int(metadata.version("megatron-core").split(".")[1])
    assert found[1].__name__ == ("HybridStack" if minor >= 18 else "MambaStack"), release_label()
    assert {"mamba_layer", "attention_layer", "mlp_layer", "moe_layer"} <= set(found[2].__dataclass_fields__)


def test_hybrid_spec_goes_to_the_provider_field_it_has() -> None:
    class MambaProvider:  # bridge <= 0.5: MambaModelProvider
        mamba_stack_spec = None
        moe_shared_expert_overlap = True

    class HybridProvider:  # bridge >= 0.6: HybridModelProvider
        hybrid_stack_spec = None

    old, new = MambaProvider(), HybridProvider()
    assert (hybrid_spec_field(old), hybrid_spec_field(new), hybrid_spec_field(object())) == (
        "mamba_stack_spec", "hybrid_stack_spec", None
    )  # fmt: skip
    configure_hybrid_provider(old, "cpu")
    configure_hybrid_provider(new, "cuda")
    assert old.mamba_stack_spec is compat.cpu_hybrid_stack_spec and old.moe_shared_expert_overlap is False
    assert new.hybrid_stack_spec is compat.cpu_hybrid_stack_spec and not hasattr(old, "hybrid_stack_spec")


def test_legacy_grouped_mlp_only_where_the_local_spec_builds_it() -> None:
    """megatron-core 0.16's local spec builds GroupedMLP for moe_grouped_gemm (it needs grouped_gemm); later: never."""
    legacy = metadata.version("megatron-core").startswith("0.16.")
    assert builds_legacy_grouped_mlp() == (legacy and optional_module("grouped_gemm") is None), release_label()


@pytest.mark.fresh_process
def test_shims_skipped_in_this_release_are_those_whose_target_is_absent(installed: dict) -> None:
    core = ".".join(metadata.version("megatron-core").split(".")[:2])
    # 9: one GDN constructor site is in ssm/gated_delta_net/common.py (0.19); 14: moe_utils binds its TE names (0.17+);
    # 17: no mla_qk_norm_config before 0.19; 27 / 28 / 29: sites of bridge code older releases lack (the Qwen3-VL mrope,
    # MiniMax-M2's full-width q/k norm mapping: 0.4+; Gemma 4's dense rotary embedding: 0.6)
    expected = {"0.16": "[9, 17, 27, 28, 29]", "0.17": "[9, 14, 17, 29]", "0.18": "[9, 14, 17, 29]"}.get(core, "[14]")
    assert str(installed["skipped"]) == expected, release_label()


@pytest.mark.fresh_process
def test_shim14_still_needed_moe_utils_leaves_te_names_unbound() -> None:
    """Fails when megatron-core's moe_utils binds te_general_gemm without TE (0.17+ do: the shim's target is absent)."""
    res = _run("from megatron.core.transformer.moe import moe_utils\nprint(hasattr(moe_utils, 'te_general_gemm'))")
    assert res.returncode == 0, res.stderr[-2000:]
    if res.stdout.strip() == "True":
        pytest.skip(f"{release_label()}: moe_utils binds its TE names without TE, so shim 14 is not needed")
    source = Path(optional_module("megatron.core.transformer.moe.moe_utils").__file__).read_text()
    assert "if te_general_gemm is not None" in source


@pytest.mark.fresh_process
def test_shim14_lets_the_router_gating_run_upstream_torch_path(installed: dict) -> None:
    assert installed["gating"] is True, installed


# ---- fixtures: the same bytes in every environment -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(FIXTURES))
def test_stored_layout_is_what_the_reference_transformers_derives(name: str) -> None:
    import transformers

    if transformers.__version__ != REFERENCE_TRANSFORMERS:
        pytest.skip(
            f"layouts are derived with transformers {REFERENCE_TRANSFORMERS}; this is {transformers.__version__}"
        )
    assert derive_layout(get_spec(name)) == load_layout(get_spec(name)), (
        f"run python -m convcheck.fixtures.refresh {name}"
    )


@pytest.mark.parametrize("name", list(FIXTURES))
def test_fixture_bytes_do_not_depend_on_the_installed_transformers(name: str, tmp_path: Path) -> None:
    assert folder_digests(build_fixture(f"tiny:{name}", tmp_path / name)) == stored_digests()[name], release_label()


@pytest.mark.parametrize("name", list(FIXTURES))
def test_this_transformers_loads_the_fixture_or_the_table_says_why(name: str) -> None:
    import transformers

    folder = build_fixture(f"tiny:{name}")
    reason = RELEASES[INSTALLED].unsupported.get(name) if INSTALLED in RELEASES else None
    if reason is None:
        config = transformers.AutoConfig.from_pretrained(folder)
        assert type(config).__name__ == get_spec(name).config_class
        return
    with pytest.raises((ValueError, KeyError, *_config_validation_errors())):
        transformers.AutoConfig.from_pretrained(folder)


def _config_validation_errors() -> tuple[type[Exception], ...]:
    """The error a strict-dataclass config of transformers 5.8+ raises on a value it refuses (huggingface_hub wraps the
    ValueError: `StrictDataclassClassValidationError`, an Exception only); none where this hub has no such class."""
    try:
        from huggingface_hub.errors import StrictDataclassClassValidationError
    except ImportError:
        return ()
    return (StrictDataclassClassValidationError,)


# ---- release smoke (make test-release BRIDGE=X) --------------------------------------------------------------------


def _first_findings(report: dict) -> dict[str, str]:
    """Failing oracle -> `TENSOR [KIND]` of its first finding."""
    out = {}
    for oracle in report["oracles"]:
        if oracle["verdict"] != "pass":
            first = oracle["findings"][0] if oracle["findings"] else {"tensor": "-", "kind": "no-findings"}
            out[oracle["name"]] = f"{first['tensor']} [{first['kind']}]"
    return out


def smoke_case(case: str) -> tuple[str, str, str, str, str]:
    """FIXTURE@LAYOUT[+te][+EXPERTS][:ORACLES] -> (fixture, layout, spec, experts, oracles); "" where not given."""
    fixture, _, where = case.partition("@")
    where, _, oracles = where.partition(":")
    layout, *extras = where.split("+")
    spec = "te" if "te" in extras else "local"
    experts = next((e for e in extras if e != "te"), "")
    return fixture, layout, spec, experts, oracles


def test_smoke_cases_read_as_written() -> None:
    assert smoke_case("qwen3-moe@tp2ep2+te") == ("qwen3-moe", "tp2ep2", "te", "", "")
    assert smoke_case("glm4.5@tp1+te-grouped") == ("glm4.5", "tp1", "local", "te-grouped", "")
    assert smoke_case("llama@pp2:save") == ("llama", "pp2", "local", "", "save")
    assert all(ParallelLayout.parse(smoke_case(c)[1]) for c in SMOKE_CASES)


@pytest.mark.skipif(not SMOKE, reason="the release smoke runs under make test-release BRIDGE=X")
def test_release_env_holds_the_table_pins() -> None:
    row = get_release(INSTALLED)
    for line in row.requirements():
        dist, _, version = line.partition("==")
        assert metadata.version(dist) == version, f"{line}: this env has {metadata.version(dist)}"
    assert on_current_pins() == (INSTALLED == current_release())


@pytest.mark.ranks
@pytest.mark.skipif(not SMOKE, reason="the release smoke runs under make test-release BRIDGE=X")
@pytest.mark.parametrize("case", SMOKE_CASES)
def test_release_smoke(case: str, tmp_path: Path) -> None:
    fixture, layout, spec, experts, oracles = smoke_case(case)
    if fixture in RELEASES[INSTALLED].unsupported:
        pytest.skip(f"{release_label()}: {RELEASES[INSTALLED].unsupported[fixture]}")
    grid = ParallelLayout.parse(layout)
    res = run_cli("verify", "--model", f"tiny:{fixture}", *grid.cli_args(), "--table", "none", "--timeout", "240",
                  "--spec", spec, *(("--experts", experts) if experts else ()),
                  *(("--oracle", oracles) if oracles else ()), tmp_path=tmp_path, timeout=900)  # fmt: skip
    expected = RELEASES[INSTALLED].smoke.get(case, {})
    if STOPS in expected:
        assert res.code == 2 and expected[STOPS] in res.err, res.err[-2000:]
        return
    assert res.code in (0, 1) and res.report is not None, res.err[-2000:]
    assert res.report["versions"]["megatron-bridge"] == INSTALLED
    assert _first_findings(res.report) == expected, f"{release_label()}: update `smoke` in convcheck/gate/releases.toml"
    assert res.code == (1 if expected else 0)


IMPORT_ALL = textwrap.dedent("""
    import importlib, json, pkgutil, convcheck
    failed = {}
    for info in pkgutil.walk_packages(convcheck.__path__, "convcheck."):
        if info.name in ("convcheck.__main__", "convcheck.rollout.host"):  # a command; the engine's interpreter's
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            failed[info.name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(failed))
""")


@pytest.mark.fresh_process
@pytest.mark.skipif(not SMOKE, reason="the release smoke runs under make test-release BRIDGE=X")
def test_every_module_imports_but_hooks_whose_upstream_target_this_release_lacks() -> None:
    """The rank side imports megatron, transformers and torch at module top: every module imports in each gated
    release's environment, except planted-bug hooks (convcheck.mutants) aimed at bridge code the release does not
    have yet (their mutants run on the current pins)."""
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, cwd=ROOT, check=True)
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert {m: why for m, why in failed.items() if not m.startswith("convcheck.mutants.")} == {}
    assert all("megatron" in why for why in failed.values()), failed
