"""A bridge whose provider or model build raises on a valid checkpoint and layout is a bridge bug: every oracle fails
on one `<build>` finding naming the exception and where it was raised, exit 1, never bad input (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import run_cli

HOOK = f"{Path(__file__).parent / 'support' / 'hooks_build.py'}:provider_reads_a_missing_field"


@pytest.mark.ranks
def test_a_provider_that_raises_is_a_finding_of_every_oracle(tmp_path: Path) -> None:
    res = run_cli("verify", "--model", "tiny:qwen3", "--tp", "2", "--oracle", "coverage,roundtrip", "--hook", HOOK,
                  tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out + res.err
    assert res.verdicts() == {"coverage": "fail", "roundtrip": "fail"}
    findings = res.findings()
    assert [(f["tensor"], f["kind"]) for f in findings] == [("<build>", "build-failed")] * 2
    message = findings[0]["message"]
    assert message.startswith("the bridge's provider or model build raised rank 0: AttributeError: ")
    assert "full_attention_interval" in message and "hooks_build.py:" in message and "(and 1 more rank(s))" in message
    printed = [line for line in res.out.splitlines() if "[build-failed]" in line]  # once, naming what it stopped
    assert len(printed) == 1 and printed[0].startswith("FAIL <build>: [build-failed] the bridge's provider"), res.out
    assert printed[0].endswith("(stopped: coverage, roundtrip)"), printed


def test_a_failure_every_oracle_shares_prints_once_and_the_rest_per_oracle() -> None:
    import io

    from convcheck.cli.render import print_report, shared_findings
    from convcheck.verdict import Finding, OracleVerdict, Report

    imported = Finding(tensor="<import>", kind="import-failed", message="bridge.load_hf_weights raised X at a.py:1")
    wrong = Finding(tensor="model.norm.weight", kind="bits-differ", message="element 0")
    oracles = [OracleVerdict(name="coverage", checked=1, findings=(imported,)),
               OracleVerdict(name="roundtrip", checked=1, findings=(imported, wrong)),
               OracleVerdict(name="config", checked=1, findings=())]  # fmt: skip
    assert shared_findings(oracles) == {("<import>", "import-failed", imported.message): ["coverage", "roundtrip"]}
    out = io.StringIO()
    print_report(
        Report(model="tiny:qwen3", layout={"tp": 1}, device="cpu", versions={}, oracles=tuple(oracles)), out=out
    )
    lines = out.getvalue().splitlines()
    assert lines[:2] == [
        f"FAIL <import>: [import-failed] {imported.message} (in: coverage, roundtrip)",
        "FAIL roundtrip: model.norm.weight: [bits-differ] element 0",
    ], lines


def test_a_cuda_call_or_a_missing_te_class_is_a_limit_of_the_environment_not_a_bridge_bug() -> None:
    from convcheck.errors import needs_cuda
    from convcheck.rank.bringup import _environment_limit

    no_driver = RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU")
    assert needs_cuda(no_driver) and not needs_cuda(AttributeError("'Qwen3NextConfig' object has no attribute"))
    assert _environment_limit(no_driver, "cpu") is not None and _environment_limit(no_driver, "cuda") is None
    te_none = TypeError("isinstance() arg 2 must be a type, a tuple of types, or a union")
    assert _environment_limit(te_none, "cpu") == "without Transformer Engine"
    te_version = TypeError("'>=' not supported between instances of 'NoneType' and 'Version'")  # 0.3.0 GPT-OSS
    assert _environment_limit(te_version, "cpu") == "without Transformer Engine"
    assert _environment_limit(TypeError("'>=' not supported between instances of 'int' and 'str'"), "cpu") is None
    assert _environment_limit(ValueError("Expert bias for aux-loss-free routing"), "cpu") is None


def test_an_error_raised_in_convcheck_s_compat_code_is_its_limit_not_a_bridge_bug(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hybrid TE stack spec looked up where a release has none (as convcheck did on megatron-core 0.17, whose spec
    lives in models/mamba/): the RuntimeError is raised in convcheck/compat/, so the build stops as an environment
    limit (exit 2), never a `<build> build-failed` finding; the same error raised by upstream code stays a finding."""
    from convcheck.compat import te_standin
    from convcheck.rank.bringup import _environment_limit, own_frame

    monkeypatch.setattr(te_standin, "HYBRID_TE_SPECS", (("convcheck_no_such_module.specs", "stack"),))
    monkeypatch.setattr(te_standin, "install_te_standin", dict)  # bind no stand-in into this test process's megatron
    monkeypatch.delitem(te_standin._INSTALLED, "hybrid", raising=False)
    with pytest.raises(RuntimeError, match="no hybrid TE stack spec") as caught:
        te_standin.te_hybrid_stack_spec()
    where = own_frame(caught.value)
    assert where is not None and where.startswith("convcheck/compat/te_standin.py:")
    assert (
        _environment_limit(caught.value, "cpu", "te")
        == f"through convcheck's compatibility code (it raised at {where})"
    )
    assert own_frame(RuntimeError("raised by the bridge")) is None  # no traceback in convcheck's code


def test_an_import_error_raised_in_convcheck_s_shims_is_its_limit() -> None:
    """Shim 28 called `_get_shard_spec`, which bridge 0.4.x's mapping base lacks: the bridge's import raised inside
    convcheck/compat/no_cuda.py, an exit-2 limit of convcheck (as a CUDA call on a CPU run); raised in the bridge's
    own code it stays an import-failed finding."""
    from convcheck.rank.bringup import import_limit

    error = "AttributeError: '_FullDimQKNormMapping' object has no attribute '_get_shard_spec'"
    shim = "/work/x/convcheck/compat/no_cuda.py:385 <- megatron/bridge/models/conversion/model_bridge.py:1100"
    assert import_limit(error, "cpu", shim) == (
        "through convcheck's compatibility code (it raised at convcheck/compat/no_cuda.py:385)"
    )
    bridge = "megatron/bridge/models/minimax_m2/minimax_m2_bridge.py:70 <- /work/x/convcheck/compat/no_cuda.py:390"
    assert import_limit(error, "cpu", bridge) is None
    assert import_limit("RuntimeError: Found no NVIDIA driver on your system", "cpu", bridge) is not None
    assert import_limit(None, "cpu", shim) is None


@pytest.mark.ranks
def test_a_forward_calling_cuda_on_a_cpu_run_leaves_logits_not_covered(tmp_path: Path) -> None:
    hook = f"{Path(__file__).parent / 'support' / 'hooks_build.py'}:forward_calls_cuda"
    res = run_cli("verify", "--model", "tiny:qwen3", "--oracle", "roundtrip,logits", "--hook", hook, tmp_path=tmp_path)
    assert res.code == 3, res.out + res.err  # exit 3: a gap of convcheck, not a bridge bug
    assert res.verdicts() == {"roundtrip": "pass", "logits": "not-covered"}
    logits = next(o for o in res.report["oracles"] if o["name"] == "logits")
    assert logits["not_covered"].startswith("the Megatron forward calls CUDA where convcheck has no CPU shim (rank 0:")
