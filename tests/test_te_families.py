"""The families whose bridge spec exists only on Transformer Engine (convcheck.models.te_only): Gemma 3 text,
Qwen3-VL, Qwen3-VL-MoE and MiniMax-M2, each a tiny checkpoint written by transformers' own save_pretrained
(tests/support/te_families.py). `verify` builds the bridge's own TE specs on the stand-in for them whatever `--spec`
says; every verdict is a pass, a FAIL on a named upstream bug, or not-covered (Qwen3-VL: no config table, no explicit
mappings). Gemma 3's and MiniMax-M2's own fixtures, mappings and tables: tests/test_gemma3.py, tests/test_minimax_m2.py
(MiniMax-M2's every-oracle pass at TP2xEP2 is its gate case, tests/test_verify_matrix.py).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from convcheck import api, compat
from convcheck.compat.detect import optional_module
from convcheck.models import UPSTREAM_BUG, tag_upstream_bugs
from convcheck.models.te_only import TE_ONLY, layer_spec_for
from convcheck.verdict import Finding, OracleVerdict
from tests.support.helpers import ROOT, CliResult, run_cli
from tests.support.te_families import te_family_checkpoint

HOOKS = str(ROOT / "tests" / "support" / "hooks_te_families.py")
DEFAULT = ("coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping")
NOT_COVERED = {"config": "not-covered", "mapping": "not-covered"}
EPS_BUG, DTYPE_BUG = "te-post-layernorm-default-eps", "qwen3-vl-dtype-from-text-config"


def _verify(tmp_path: Path, family: str, *args: str) -> CliResult:
    return run_cli("verify", "--model", str(te_family_checkpoint(family)), "--table", "none", *args, tmp_path=tmp_path)


def _module(name: str):  # type: ignore[no-untyped-def]
    compat.install_import_shims()
    module = optional_module(name)
    if module is None:
        pytest.skip(f"{name} is absent in this release")
    return module


def test_shim27_still_needed_mrope_allocates_on_cuda() -> None:
    """Fails when the multimodal RoPEs (and the Qwen3-VL vision RoPE's forward) stop asking
    torch.cuda.current_device() (then delete shim 27)."""
    for module_name, attribute, _ in compat.MROPE_SITES:
        owner = _module(module_name)
        cls, method = attribute.split(".")
        source = inspect.getsource(compat.upstream(getattr(getattr(owner, cls), method)))
        assert "device=torch.cuda.current_device()" in source, attribute


def test_shim28_still_needed_full_dim_qk_norm_moves_to_cuda() -> None:
    """Fails when MiniMax-M2's full-width q/k norm import stops moving to CUDA (then delete shim 28)."""
    module_name, class_name, _ = compat.FULL_DIM_QK_NORM
    mapping = getattr(_module(module_name), class_name)
    source = inspect.getsource(compat.upstream(mapping.hf_to_megatron))
    assert 'torch.device("cuda", torch.cuda.current_device())' in source


def test_shim29_still_needed_gemma_constructors_allocate_on_cuda() -> None:
    """Fails when Gemma 4's dual RoPE or Gemma 3 VL's projector stop allocating on CUDA (then delete shim 29): without
    CUDA the upstream constructor raises with the shim inactive, and builds the same frequencies on the CPU with it
    active."""
    import torch

    from convcheck.compat import no_cuda

    gemma4 = _module("megatron.bridge.models.gemma.modeling_gemma4")
    dense = inspect.signature(compat.upstream(gemma4.Gemma4DenseRotaryEmbedding.__init__))
    assert dense.parameters["use_cpu_initialization"].default is False
    assert "torch.cuda.current_device()" in inspect.getsource(gemma4._Gemma4ProportionalRotaryEmbedding.__init__)
    projector = _module("megatron.bridge.models.gemma_vl.modeling_gemma3_vl").Gemma3VLMultimodalProjector
    source = inspect.getsource(compat.upstream(projector.__init__))
    assert "ColumnParallelLinear(" in source and "use_cpu_initialization" not in source
    from megatron.core.transformer import TransformerConfig

    no_cuda.install_cpu_gemma_constructors()
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, kv_channels=16)
    config.full_attention_rope_partial_factor = 0.25
    was = no_cuda.active()
    try:
        no_cuda.set_active(False)
        if not torch.cuda.is_available():
            with pytest.raises((RuntimeError, AssertionError)):
                gemma4.Gemma4DenseRotaryEmbedding(config)
        no_cuda.set_active(True)
        rope = gemma4.Gemma4DenseRotaryEmbedding(config)
    finally:
        no_cuda.set_active(was)
    sliding = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    full = torch.cat([1.0 / (1000000.0 ** (torch.arange(0, 4, 2, dtype=torch.float32) / 16)), torch.zeros(6)])
    for got, want in ((rope.rope_sliding.inv_freq, sliding), (rope.rope_full.inv_freq, full)):
        assert got.device.type == "cpu" and torch.equal(got.view(torch.int32), want.view(torch.int32)), (got, want)


def test_te_only_architectures_build_the_te_specs_whatever_is_asked() -> None:
    for arch in TE_ONLY:
        spec, why = layer_spec_for("local", {"architectures": [arch]})
        assert spec == "te" and why is not None and why.startswith(f"{arch}: building the bridge's Transformer")
        assert layer_spec_for("te", {"architectures": [arch]}) == ("te", None)
    assert layer_spec_for("local", {"architectures": ["Qwen3ForCausalLM"]}) == ("local", None)
    assert layer_spec_for("local", {}) == ("local", None)


def test_the_family_bugs_tag_only_their_own_architecture() -> None:
    logits = OracleVerdict(
        name="logits", checked=1, findings=(Finding(tensor="logits", kind="logits-differ", message="m"),)
    )
    tagged, lines = tag_upstream_bugs("Gemma3ForCausalLM", "0.6.2", [logits])
    assert tagged[0].findings[0].detail[UPSTREAM_BUG] == EPS_BUG and len(lines) == 1
    untagged, lines = tag_upstream_bugs("Qwen3ForCausalLM", "0.6.2", [logits])
    assert UPSTREAM_BUG not in untagged[0].findings[0].detail and lines == []
    old, _ = tag_upstream_bugs("Gemma3ForCausalLM", "0.2.0", [logits])  # a release it was not seen on: not explained
    assert UPSTREAM_BUG not in old[0].findings[0].detail


@pytest.mark.ranks
def test_gemma3_tp2_fails_only_on_the_post_norm_epsilon_bug(tmp_path: Path) -> None:
    """The bridge's own Gemma 3 spec (post norms inside TERowParallelLinearLayerNorm, sliding-window attention) on
    the stand-in, chosen even with --spec local: every weight oracle, the config table and the explicit mappings
    (convcheck.models.gemma3) pass, the logits differ by the post norms' epsilon."""
    res = _verify(tmp_path, "gemma3", "--tp", "2", "--spec", "local")
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert "INFO Gemma3ForCausalLM: building the bridge's Transformer Engine specs (--spec te)" in res.err
    assert res.verdicts() == {**dict.fromkeys(DEFAULT, "pass"), "logits": "fail"}
    (finding,) = res.findings("logits")
    assert (finding["tensor"], finding["kind"], finding["detail"][UPSTREAM_BUG]) == ("logits", "logits-differ", EPS_BUG)
    assert 1e-3 < finding["detail"]["max_abs_err"] < 1e-2
    assert [c.split(":")[0] for c in res.report["causes"]] == [
        f"1 finding(s) are the known megatron-bridge bug {EPS_BUG}"
    ]


@pytest.mark.ranks
def test_gemma3_with_the_epsilon_fixed_the_logits_agree(tmp_path: Path) -> None:
    """The bug is the whole difference: with the post norms built with the config's epsilon the logits agree."""
    res = _verify(tmp_path, "gemma3", "--tp", "2", "--oracle", "logits", "--hook", f"{HOOKS}:post_norm_eps_fixed")
    assert res.code == 0, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"logits": "pass"}
    assert {o["name"]: o for o in res.report["oracles"]}["logits"]["metrics"]["max_abs_err"] < 1e-5


@pytest.mark.ranks
def test_gemma3_post_norm_loaded_from_the_pre_norm_is_named(tmp_path: Path) -> None:
    """A bug planted in the real bridge's Gemma 3 mapping: layer 0's post-attention norm (TERowParallelLinearLayerNorm's
    post_layernorm) and pre-MLP norm imported from each other's HF tensor; the export writes them back swapped."""
    res = _verify(tmp_path, "gemma3", "--tp", "2", "--oracle", "roundtrip", "--hook",
                  f"{HOOKS}:swap_gemma3_norms_on_import")  # fmt: skip
    assert res.code == 1
    found = {f["tensor"]: (f["kind"], f["detail"]["first_index"]) for f in res.findings("roundtrip")}
    assert found == {
        "model.layers.0.post_attention_layernorm.weight": ("bytes-differ", [0]),
        "model.layers.0.pre_feedforward_layernorm.weight": ("bytes-differ", [0]),
    }


@pytest.mark.ranks
def test_qwen3_vl_tp2_fails_only_on_the_dtype_bug(tmp_path: Path) -> None:
    """The bridge's Qwen3-VL model (TE language model, vision tower) on the stand-in: every tensor exported and held as
    fp32 from a bf16 checkpoint without a text_config dtype (the known dtype bug, seen by roundtrip, layout and
    mapping), the exported config the default one (qwen3-vl-config-export-flat); coverage, elements, differential and
    the text-only logits pass (no image processor: no image pass)."""
    res = _verify(tmp_path, "qwen3-vl", "--tp", "2")
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    failing = ("roundtrip", "layout", "config", "mapping")
    assert res.verdicts() == {**dict.fromkeys(DEFAULT, "pass"), **dict.fromkeys(failing, "fail")}
    findings = res.findings("roundtrip") + res.findings("layout")
    assert len(findings) == 128 and {f["detail"].get(UPSTREAM_BUG) for f in findings} == {DTYPE_BUG}
    mapping = {(f["kind"], f["detail"].get(UPSTREAM_BUG)) for f in res.findings("mapping")}
    assert mapping == {("import-dtype", DTYPE_BUG)}
    assert {f["detail"].get(UPSTREAM_BUG) for f in res.findings("config")} == {"qwen3-vl-config-export-flat"}
    assert {f["kind"] for f in res.findings("roundtrip")} == {"dtype"}
    assert any(f["tensor"].startswith("model.visual.") for f in res.findings("roundtrip"))  # the tower is exported
    logits = {o["name"]: o for o in res.report["oracles"]}["logits"]["metrics"]
    assert logits["max_abs_err"] < 1e-5 and logits["greedy_match"] == "32/32"


@pytest.mark.ranks
def test_qwen3_vl_norm_swap_changes_the_logits(tmp_path: Path) -> None:
    """A bug planted in the real Qwen3-VL mapping (layer 0's input and post-attention norms imported from each other's
    HF tensor) changes the text-only logits (the roundtrip oracle reports every tensor's fp32 dtype, the known bug)."""
    res = _verify(tmp_path, "qwen3-vl", "--tp", "2", "--oracle", "logits", "--hook",
                  f"{HOOKS}:swap_qwen3_vl_norms_on_import")  # fmt: skip
    assert res.code == 1
    found = {(f["tensor"], f["kind"]) for f in res.findings("logits")}
    assert found == {("logits", "logits-differ"), ("greedy-tokens", "greedy-differs")}


@pytest.mark.ranks
def test_minimax_m2_norm_swap_is_named(tmp_path: Path) -> None:
    res = _verify(tmp_path, "minimax-m2", "--tp", "2", "--ep", "2", "--oracle", "roundtrip", "--hook",
                  f"{HOOKS}:swap_minimax_norms_on_import")  # fmt: skip
    assert res.code == 1
    found = {f["tensor"]: (f["kind"], f["detail"]["first_index"]) for f in res.findings("roundtrip")}
    assert found == {
        "model.layers.0.input_layernorm.weight": ("bytes-differ", [0]),
        "model.layers.0.post_attention_layernorm.weight": ("bytes-differ", [0]),
    }


@pytest.mark.ranks
def test_gemma3_builds_the_bridges_own_te_classes_on_the_stand_in() -> None:
    """The bridge's TERowParallelLinearLayerNorm and Gemma3TEDotProductAttention, built from their own class bodies on
    the stand-in (not convcheck's replacement spec), chosen without asking for --spec te; the post norm's epsilon is
    TE's default, the bug's cause."""
    got = api.run_in_ranks(f"{HOOKS}:built", str(te_family_checkpoint("gemma3")), "tp2", load_hf=False)
    bridge, standin = "megatron.bridge.models", "convcheck.kernels.te"
    assert got["self_attention.linear_proj"] == [
        f"{bridge}.common.te_layers.TERowParallelLinearLayerNorm",
        f"{standin}.linear.TERowParallelLinear",
        f"{standin}.linear.TELinear",
    ]
    assert got["mlp.linear_fc2"] == got["self_attention.linear_proj"]
    assert got["self_attention.core_attention"][:2] == [
        f"{bridge}.gemma.gemma3_provider.Gemma3TEDotProductAttention",
        f"{standin}.attention.TEDotProductAttention",
    ]
    assert got["post_norm_eps"] == 1e-5


@pytest.mark.ranks
def test_a_cuda_call_in_the_import_is_a_setup_limit_not_a_finding(tmp_path: Path) -> None:
    """Without shim 28 the bridge's MiniMax-M2 import calls CUDA on the CPU: exit 2 naming that, no FAIL finding."""
    res = _verify(tmp_path, "minimax-m2", "--tp", "2", "--oracle", "coverage", "--hook", f"{HOOKS}:shim28_removed")
    assert res.code == 2, res.out[-3000:] + res.err[-2000:]
    assert "this checkpoint cannot be loaded on the CPU: the bridge's import calls CUDA where convcheck has no CPU" in (
        res.err
    )
    assert "; run with --device cuda" in res.err and res.report is None  # torch's own message differs in a fork
