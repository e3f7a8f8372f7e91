"""The reference quantizers against hand-computed blocks, bitwise (integer views), and the name-set logic of a
quantization_config. Only the dequantization bound test compares magnitudes, and it reports what it measured."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from convcheck.errors import BadInput
from convcheck.quant import FORMATS, expected_quantized, matches, over_matches, parse_quantizer, target_from_config
from convcheck.quant import reference as ref
from convcheck.quant.names import QuantTarget, loose_reading
from convcheck.quant.quantizer import load_quantizer


def bits(t: torch.Tensor) -> list[int]:
    """Each element's raw bits as an unsigned integer (row-major)."""
    width = t.element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[width]
    return [int(v) & ((1 << (8 * width)) - 1) for v in t.contiguous().reshape(-1).view(view).tolist()]


def f32_bits(value: np.float32) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


def bf16(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bfloat16)


# Two 2x2 blocks: amax 3 and 6. E4M3 codes worked out by hand: sign | exponent (bias 7) | 3 mantissa bits.
#   x / (3 / 448): 1 -> 149.3 -> 144 = 1.125 * 2^7 = 0x71; -0.5 -> -74.7 -> -72 = 0xE9; 0.125 -> 18.7 -> 18 = 0x59;
#   3 -> 448 = 1.75 * 2^8 = 0x7E. Block 2 has twice the scale: 0.25 -> 0x59, 2 -> 0x71, -6 -> -448 = 0xFE, 0 -> 0x00.
X = bf16([[1.0, -0.5, 0.25, 2.0], [0.125, 3.0, -6.0, 0.0]])
FP8_BLOCK_BYTES = [0x71, 0xE9, 0x59, 0x71, 0x59, 0x7E, 0xFE, 0x00]
BLOCK128 = (128, 128)


def test_fp8_block_divides_amax_by_448() -> None:
    q, scale = ref.fp8_block(X, (2, 2))
    assert q.dtype == torch.float8_e4m3fn and tuple(q.shape) == (2, 4)
    assert bits(q) == FP8_BLOCK_BYTES
    s0 = np.float32(3) / np.float32(448)
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (1, 2)
    assert bits(scale) == [f32_bits(s0), f32_bits(np.float32(6) / np.float32(448))]
    assert f32_bits(np.float32(6) / np.float32(448)) == f32_bits(s0 * np.float32(2))


def test_fp8_block_pads_the_edge_block_with_zeros() -> None:
    """A [3, 3] weight in 2x2 blocks: grid [2, 2]; the edge blocks' amax is that of their real elements only."""
    x = bf16([[0.5, 1.0, -2.0], [0.25, 0.75, 0.125], [4.0, -1.5, 0.0625]])
    q, scale = ref.fp8_block(x, (2, 2))
    amax = [1.0, 2.0, 4.0, 0.0625]
    assert bits(scale) == [f32_bits(np.float32(a) / np.float32(448)) for a in amax]
    # the corner element is its block's amax: 0.0625 / (0.0625 / 448) = 448 = 0x7E
    assert tuple(q.shape) == (3, 3) and bits(q)[8] == 0x7E


def test_fp8_block_all_zero_block_gives_a_zero_scale_and_nan_bytes() -> None:
    """No epsilon in slime / verl's formula: 0 / 0 is NaN, and the NaN casts to an E4M3 NaN (S.1111.111; x86's
    default NaN keeps the sign bit); the quant oracle reports such a scale (scale-invalid)."""
    q, scale = ref.fp8_block(torch.zeros(2, 2, dtype=torch.bfloat16), (2, 2))
    assert bits(scale) == [0] and [b & 0x7F for b in bits(q)] == [0x7F] * 4


def test_nemo_rl_inverts_448_over_amax() -> None:
    """amax 0.6875: 0.6875 / 448 = 0x3ac92492 but 1 / (448 / 0.6875) = 0x3ac92493 (the last bit)."""
    x = torch.full((2, 2), 0.6875, dtype=torch.bfloat16)
    _, slime = ref.fp8_block(x, (2, 2))
    q, nemo = ref.fp8_nemo_rl(x, (2, 2))
    assert bits(slime) == [0x3AC92492] and bits(nemo) == [0x3AC92493]
    assert bits(q) == [0x7E] * 4  # 0.6875 * (448 / 0.6875) rounds to 448
    q, nemo = ref.fp8_nemo_rl(X, (2, 2))
    assert bits(q) == FP8_BLOCK_BYTES
    # torch computes a Python float over a tensor (448.0 / amax) as reciprocal(amax) * 448: two float32 roundings
    s = [(np.float32(1) / np.float32(a)) * np.float32(448) for a in (3, 6)]
    assert bits(nemo) == [f32_bits(np.float32(1) / v) for v in s]
    assert bits(nemo)[0] != f32_bits(np.float32(1) / (np.float32(448) / np.float32(3)))


def test_nemo_rl_zero_block_keeps_scale_one_and_refuses_partial_blocks() -> None:
    q, scale = ref.fp8_nemo_rl(torch.zeros(2, 2, dtype=torch.bfloat16), (2, 2))
    assert bits(scale) == [f32_bits(np.float32(1))] and bits(q) == [0] * 4
    with pytest.raises(BadInput, match="divides"):
        ref.fp8_nemo_rl(torch.zeros(3, 2, dtype=torch.bfloat16), (2, 2))


def test_ue8m0_rounds_the_scale_up_to_a_power_of_two() -> None:
    """amax 3: 3 / 448 = 0.0067 -> 2^-7; q = x * 128: 1 -> 128 = 0x70, -0.5 -> -64 = 0xE8, 0.125 -> 16 = 0x58,
    3 -> 384 = 1.5 * 2^8 = 0x7C. amax 6 -> 2^-6; 0.25 -> 16, 2 -> 128, -6 -> -384 = 0xFC, 0 -> 0."""
    q, scale = ref.fp8_ue8m0(X, (2, 2))
    assert bits(q) == [0x70, 0xE8, 0x58, 0x70, 0x58, 0x7C, 0xFC, 0x00]
    assert bits(scale) == [f32_bits(np.float32(2.0**-7)), f32_bits(np.float32(2.0**-6))]
    _, tiny = ref.fp8_ue8m0(torch.zeros(2, 2, dtype=torch.bfloat16), (2, 2))
    assert bits(tiny) == [f32_bits(np.float32(2.0**-22))]  # amax clamped to 1e-4: 1e-4 / 448 -> 2^-22


def test_mxfp8_e8m0_scale_per_32_elements() -> None:
    """Block 1 (amax 3): e = ceil(log2(3 / 448)) = -7, scale byte 120, q = x * 2^7; block 2 all zero: e = -127,
    scale byte 0, q 0."""
    row = torch.zeros(1, 64, dtype=torch.bfloat16)
    row[0, :4] = torch.tensor([1.0, -0.5, 0.125, 3.0])
    q, scale = ref.mxfp8(row, (1, 32))
    assert scale.dtype == torch.uint8 and bits(scale) == [120, 0]
    assert bits(q)[:4] == [0x70, 0xE8, 0x58, 0x7C] and set(bits(q)[4:]) == {0}
    back = ref.dequant_mxfp8(q, scale, (1, 32))
    assert bits(back[0, :4]) == bits(row[0, :4].float())


def test_nvfp4_hand_blocks() -> None:
    """Global amax 2.625: weight_scale_2 = 2.625 / 2688 = 2^-10. Block 1 (amax 2.625): block scale 448 (0x7E), v = x /
    0.4375: 2.625 -> 6 (code 7), -1.3125 -> -3 (code 8 | 5), 0.4375 -> 1 (code 2). Block 2 (amax 6 / 128): scale 8
    (0x50), v = x * 128: 6 -> 7; 0.75 ties to 1 (code 2); -1.5 -> 8 | 3; 2.5 ties to 2 (code 4); 1.75 ties to 2."""
    row = torch.zeros(1, 32, dtype=torch.bfloat16)
    row[0, :3] = torch.tensor([2.625, -1.3125, 0.4375])
    row[0, 16:21] = torch.tensor([6.0, 0.75, -1.5, 2.5, 1.75]) / 128
    packed, weight_scale, weight_scale_2 = ref.nvfp4(row, (1, 16))
    assert bits(weight_scale_2) == [f32_bits(np.float32(2.0**-10))] and tuple(weight_scale_2.shape) == ()
    assert weight_scale.dtype == torch.float8_e4m3fn and bits(weight_scale) == [0x7E, 0x50]
    codes = [7, 13, 2] + [0] * 13 + [7, 2, 11, 4, 4] + [0] * 11
    assert bits(packed) == [codes[2 * i + 1] << 4 | codes[2 * i] for i in range(16)]
    back = ref.dequant_nvfp4(packed, weight_scale, weight_scale_2, (1, 16))
    assert back[0, :3].tolist() == [2.625, -1.3125, 0.4375] and back[0, 16:21].mul(128).tolist() == [6, 1, -1.5, 2, 2]


def _slime(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """slime / verl's per-block quantization as published, bf16 operands and all (pad, max over dims 1 and 3)."""
    import torch.nn.functional as F

    (b0, b1), (m, n) = block, w.shape
    rows, cols = -(-m // b0), -(-n // b1)
    v = F.pad(w, (0, cols * b1 - n, 0, rows * b0 - m), mode="constant", value=0.0).reshape(rows, b0, cols, b1)
    block_max = torch.max(torch.max(torch.abs(v), dim=1, keepdim=True)[0], dim=3, keepdim=True)[0]
    scale = block_max.to(torch.float32) / torch.finfo(torch.float8_e4m3fn).max
    q = (v / scale).clamp(min=-448.0, max=448.0).reshape(rows * b0, cols * b1).to(torch.float8_e4m3fn)
    return q[:m, :n].contiguous(), scale.reshape(rows, cols)


def _deepgemm_ue8m0(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's per_block_cast_to_fp8(use_ue8m0=True) as published (zeros, amax of float, clamp 1e-4, ceil pow2)."""
    m, n = w.shape
    b0, b1 = block
    padded = torch.zeros((-(-m // b0) * b0, -(-n // b1) * b1), dtype=w.dtype)
    padded[:m, :n] = w
    v = padded.view(-1, b0, padded.size(1) // b1, b1)
    sf = v.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4) / 448.0
    sf = torch.pow(2.0, torch.ceil(torch.log2(sf.abs())))
    q = (v * (1.0 / sf)).to(torch.float8_e4m3fn)
    return q.view_as(padded)[:m, :n].contiguous(), sf.view(v.size(0), v.size(2))


@pytest.mark.parametrize("shape", [(256, 384), (200, 300)])
def test_references_equal_the_published_formulas_on_random_weights(shape: tuple[int, int]) -> None:
    """The float32, in-place references give the bits of the formulas as published on bf16 operands (edge blocks
    padded in the second shape; one block all zero, one holding -0.0)."""
    gen = torch.Generator().manual_seed(11)
    x = (torch.rand(shape, generator=gen) * 2 - 1) * torch.exp2(-torch.randint(0, 16, shape, generator=gen))
    x = x.to(torch.bfloat16)
    x[:128, :128] = 0.0
    x[128:, 128:256] = -0.0
    for mine, theirs in ((ref.fp8_block, _slime), (ref.fp8_ue8m0, _deepgemm_ue8m0)):
        q, scale = mine(x, BLOCK128)
        q2, scale2 = theirs(x, BLOCK128)
        assert bits(q) == bits(q2) and bits(scale) == bits(scale2), mine.__name__


def test_every_format_has_a_reference_and_the_bridge_flag_matches_its_scales() -> None:
    for fmt in FORMATS.values():
        assert fmt.function in ref.REFERENCES, fmt.name
        assert fmt.bridge == (fmt.scale_count == 1), fmt.name


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_dequantized_within_the_format_bound(name: str, record_property: pytest.RecordProperty) -> None:
    """dequantize(quantize(x)) within the bound of the format's rounding for values over 2^-20 .. 1 and edge blocks;
    the measured worst ratio of error to bound is reported (record_property and -s output)."""
    gen = torch.Generator().manual_seed(7)
    x = (torch.rand(256, 384, generator=gen) * 2 - 1) * torch.exp2(-torch.randint(0, 20, (256, 384), generator=gen))
    x = x.to(torch.bfloat16)
    quantizer = load_quantizer(name, None)
    out = quantizer.quantize(x)
    err = (quantizer.dequantize(out[0], out[1:]) - x.float()).abs()
    ratio = float((err / quantizer.bound(x, out[1:])).max())
    blockwise, max_error = quantizer.error(x, out)  # what the oracle computes, on the block view
    assert abs(blockwise - ratio) < 1e-5 and max_error == float(err.max())
    record_property(f"{name}_worst_error_over_bound", ratio)
    print(f"{name}: max |error| {float(err.max()):.3g}, worst error / bound {ratio:.3f}")
    assert ratio <= 1.0


MODELOPT = """
import json, torch
from convcheck.quant import reference as ref
from modelopt.torch.quantization.qtensor.mxfp8_tensor import MXFP8QTensor
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
gen = torch.Generator().manual_seed(3)
x = ((torch.rand(64, 96, generator=gen) * 2 - 1) * torch.exp2(-torch.randint(0, 12, (64, 96), generator=gen)))
x = x.to(torch.bfloat16)
x[5, 32:64] = 0  # an all-zero block
same = lambda a, b: a.dtype == b.dtype and a.shape == b.shape and torch.equal(
    a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))
mq, ms = MXFP8QTensor.quantize(x)
q, s = ref.mxfp8(x)
nq, nws, nws2 = NVFP4QTensor.quantize(x, 16)
p, ws, ws2 = ref.nvfp4(x)
print(json.dumps({"mxfp8": [same(mq._quantized_data, q), same(ms, s)],
                  "nvfp4": [same(nq._quantized_data, p), same(nws, ws), same(nws2.reshape(()), ws2)]}))
"""


@pytest.mark.fresh_process
def test_mxfp8_and_nvfp4_equal_modelopt_bitwise() -> None:
    """The real ModelOpt (installed beside the bridge) quantizes the same bytes and scales (a fresh interpreter: it
    imports megatron)."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(MODELOPT)], capture_output=True, text=True,
                         timeout=300, check=False, cwd=Path(__file__).parents[1])  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == '{"mxfp8": [true, true], "nvfp4": [true, true, true]}'


# ---- the names a quantization_config quantizes ---------------------------------------------------------------------


def test_pattern_names_modules_on_dot_boundaries_only() -> None:
    assert matches("mlp.gate", "model.layers.0.mlp.gate")
    assert not matches("mlp.gate", "model.layers.0.mlp.gate_up_proj")
    assert matches("model.layers.1", "model.layers.1.self_attn.q_proj")
    assert not matches("model.layers.1", "model.layers.10.self_attn.q_proj")
    assert matches("lm_head", "lm_head") and matches("q_proj.weight", "model.layers.0.self_attn.q_proj")
    assert matches(r"re:.*\.experts\.\d+\.down_proj", "model.layers.0.mlp.experts.3.down_proj")
    assert not matches(r"re:experts\.\d+", "model.layers.0.mlp.experts.3.down_proj")  # re: matches the whole name


def test_over_matching_readings_are_named() -> None:
    modules = ["model.layers.0.mlp.gate", "model.layers.0.mlp.gate_up_proj", "model.layers.10.self_attn.o_proj"]
    assert over_matches(["mlp.gate", "model.layers.1"], modules) == [
        ("mlp.gate", "model.layers.0.mlp.gate_up_proj", "substring"),
        ("model.layers.1", "model.layers.10.self_attn.o_proj", "substring"),
    ]
    assert loose_reading("model.layers.0.mlp.gat", "model.layers.0.mlp.gate") == "substring"
    assert loose_reading("model.layers.0.mlp.gate", "model.layers.0.mlp.gate") == ""


def test_expected_quantized_from_a_config() -> None:
    shapes = {
        "model.embed_tokens.weight": (152, 128),
        "model.layers.0.input_layernorm.weight": (128,),
        "model.layers.0.mlp.gate.weight": (8, 128),
        "model.layers.0.mlp.experts.0.gate_proj.weight": (128, 128),
        "model.layers.0.self_attn.q_proj.weight": (512, 128),
        "model.layers.1.self_attn.q_proj.weight": (512, 128),
        "lm_head.weight": (152, 128),
    }
    target = target_from_config(
        {"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["model.layers.1"]}, "t"
    )
    assert target.block == (128, 128) and target.ignore == ("model.layers.1",)
    out = expected_quantized(shapes, target)
    assert sorted(n for n, why in out.items() if not why) == [
        "model.layers.0.mlp.experts.0.gate_proj.weight",
        "model.layers.0.self_attn.q_proj.weight",
    ]
    assert out["model.layers.1.self_attn.q_proj.weight"] == "its module is named by the pattern 'model.layers.1'"
    assert out["model.layers.0.mlp.gate.weight"] == "its module is named by the pattern 'mlp.gate'"
    assert out["model.layers.0.input_layernorm.weight"] == "not a 2-D weight"
    assert QuantTarget(block=None, ignore=(), source="x").patterns[:3] == (
        "embed_tokens",
        "lm_head",
        "shared_head.head",
    )
    mtp = {"model.layers.4.embed_tokens.weight": (152, 32), "model.layers.4.shared_head.head.weight": (152, 32)}
    assert all(expected_quantized(mtp, target).values())  # an MTP layer's copies of the embedding and LM head


# ---- the --quantizer spelling and a user's function -----------------------------------------------------------------


def test_parse_quantizer(tmp_path: Path) -> None:
    assert parse_quantizer("fp8-block") == "fp8-block"
    with pytest.raises(BadInput, match="unknown quantizer 'fp9'; known: fp8-block, fp8-nemo-rl"):
        parse_quantizer("fp9")
    with pytest.raises(BadInput, match="quantizer file not found"):
        parse_quantizer(str(tmp_path / "nope.py") + ":q")
    (tmp_path / "bad.py").write_text("def q(:\n")
    with pytest.raises(BadInput, match="does not parse"):
        parse_quantizer(str(tmp_path / "bad.py") + ":q")
    (tmp_path / "mine.py").write_text("def quant(w, block):\n    return w, w\n")
    with pytest.raises(BadInput, match="defines no top-level 'other'"):
        parse_quantizer(str(tmp_path / "mine.py") + ":other")
    assert parse_quantizer(str(tmp_path / "mine.py") + ":quant") == f"{tmp_path / 'mine.py'}:quant"


def test_user_quantizer_that_raises_or_returns_the_wrong_dtype_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "q.py").write_text(
        "import torch\n"
        "def boom(w, block):\n    raise ValueError('no fp8 here')\n"
        "def wide(w, block):\n    return w.to(torch.float16), torch.ones(2, 2)\n"
        "def ok(w, block):\n"
        "    from convcheck.quant.reference import fp8_block\n    return fp8_block(w, tuple(block))\n"
    )
    with pytest.raises(BadInput, match=r"raised ValueError: no fp8 here on a \[256, 256\] bf16 weight"):
        load_quantizer(f"{tmp_path / 'q.py'}:boom", None)
    with pytest.raises(BadInput, match="returned a float16 \\[256, 256\\] weight .* expected float8_e4m3fn"):
        load_quantizer(f"{tmp_path / 'q.py'}:wide", None)
    quantizer = load_quantizer(f"{tmp_path / 'q.py'}:ok", 64)
    assert quantizer.block == (64, 64) and quantizer.bridge
