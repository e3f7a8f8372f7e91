"""The quant oracle on tiny:qwen3-moe-fp8 through the real bridge: clean runs at TP1, TP2, EP2 (and TP2 x EP2, PP2)
name only the two known scale-shape bugs; each planted bug of convcheck.mutants.catalog_quant is named by tensor,
block and first differing element. Every test asserts the whole verdict: the exact set of (tensor, kind), the
expected findings of a planted bug worked out here from the checkpoint with the reference quantizers."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from convcheck import api
from convcheck.errors import BadInput
from convcheck.fixtures.build import build_fixture
from convcheck.models import UPSTREAM_BUG
from convcheck.mutants.catalog_quant import QUANT_MUTANTS, QUANT_OVERMATCH_CONFIG
from convcheck.quant import reference as ref
from convcheck.verdict import OracleVerdict
from convcheck.workflows.selftest import check_catalog
from tests.support.helpers import pinned_spec

FIXTURE = "tiny:qwen3-moe-fp8"
LAYERS, EXPERTS = range(2), range(16)
SCALE = "_scale_inv"
BLOCK = (128, 128)


def run(layout: str = "tp1", hooks: tuple[str, ...] = (), **options: Any) -> OracleVerdict:
    report = api.verify(FIXTURE, layout, oracles=("quant",), hooks=hooks, options=options, spec=pinned_spec())
    (verdict,) = report.oracles
    return verdict


def kinds(verdict: OracleVerdict) -> set[tuple[str, str]]:
    pairs = [(f.tensor, f.kind) for f in verdict.findings]
    assert len(pairs) == len(set(pairs)), "a finding named twice"
    return set(pairs)


def experts(layers: Any = LAYERS, ids: Any = EXPERTS, projs: str = "gate up down", suffix: str = "") -> list[str]:
    return [
        f"model.layers.{n}.mlp.experts.{e}.{p}_proj.weight{suffix}" for n in layers for e in ids for p in projs.split()
    ]


def attention(projs: str = "q k v o", suffix: str = "") -> list[str]:
    return [f"model.layers.{n}.self_attn.{p}_proj.weight{suffix}" for n in LAYERS for p in projs.split()]


AUTOGRAD = ("<quantized export>", "quant-fn-autograd")
KNOWN = {(n, "scale-shape") for n in experts(suffix="_scale_inv") + attention("q k v", "_scale_inv")} | {AUTOGRAD}
"""What every run names: the expert scales and the q, k, v scales on the wrong grid, and quant_fn called with autograd
on (three upstream bugs)."""
QUANTIZED = experts() + attention()


@functools.cache
def source() -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out = {}
    for file in sorted(Path(build_fixture(FIXTURE)).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            out.update({name: handle.get_tensor(name) for name in handle.keys()})  # noqa: SIM118 - not a dict
    return out


def differing(make: Any, names: list[str]) -> set[tuple[str, str]]:
    """The (tensor, kind) a sender computing `make(name, x)` instead of fp8_block gives, worked out here."""
    out = set()
    for name in names:
        q, scale = ref.fp8_block(source()[name], BLOCK)
        q2, scale2 = make(name, source()[name])
        if not torch.equal(q.view(torch.uint8), q2.view(torch.uint8)):
            out.add((name, "bytes-differ"))
        if not torch.equal(scale.view(torch.int32), scale2.reshape(scale.shape).view(torch.int32)):
            out.add((name[: -len("weight")] + "weight" + SCALE, "scale-differs"))
    return out


def assert_known_bugs_only(verdict: OracleVerdict) -> None:
    assert verdict.verdict == "fail" and kinds(verdict) == KNOWN
    assert {f.detail.get(UPSTREAM_BUG) for f in verdict.findings} == {
        "quant-expert-scale-squeezed",
        "quant-qkv-scale-3d",
        "quant-export-autograd",
    }
    shapes = [f for f in verdict.findings if f.kind == "scale-shape"]
    assert all("the reference's values in another shape" in f.message for f in shapes)
    (autograd,) = (f for f in verdict.findings if f.kind == "quant-fn-autograd")
    assert autograd.detail["autograd"] == autograd.detail["total"] > 0
    assert verdict.checked == 2 * len(QUANTIZED) + 13  # weights, their scales, and 13 tensors left bf16
    assert verdict.metrics["quantized_weights"] == len(QUANTIZED)
    assert 0.5 < verdict.metrics["worst_error_over_bound"] <= 1.0


@pytest.mark.ranks
@pytest.mark.parametrize("layout", ["tp1", "tp2", "ep2", "tp2ep2", "pp2"])
def test_every_byte_and_scale_is_the_whole_tensor_reference(layout: str) -> None:
    """Every quantized byte and scale value equals fp8-block applied to the whole bf16 tensor; only the scale grids of
    the experts (param_mapping.py:880) and of q, k, v (:3441) are wrong, and quant_fn runs with autograd on
    (quant_bridge.py:33), each finding tagged with its bug."""
    verdict = run(layout)
    assert_known_bugs_only(verdict)
    assert verdict.metrics["bf16_from"] == "a drain of the bridge's bf16 export"


@pytest.mark.ranks
@pytest.mark.parametrize("quantizer", ["fp8-nemo-rl", "fp8-ue8m0", "mxfp8"])
def test_every_bridge_quantizer_at_ep2(quantizer: str) -> None:
    verdict = run("ep2", quantizer=quantizer)
    assert_known_bugs_only(verdict)
    assert verdict.metrics["quantizer"].startswith(quantizer)


@pytest.mark.ranks
def test_source_read_when_roundtrip_proved_the_export() -> None:
    report = api.verify(FIXTURE, "ep2", oracles=("roundtrip", "quant"))
    roundtrip, quant = report.oracles
    assert roundtrip.verdict == "pass"
    assert_known_bugs_only(quant)
    assert quant.metrics["bf16_from"] == "the source (the export proven equal to it by roundtrip)"


@pytest.mark.ranks
def test_nvfp4_export_is_not_covered() -> None:
    verdict = run(quantizer="nvfp4")
    assert (
        verdict.verdict == "not-covered"
        and verdict.findings == ()
        and "export_hf_weights_modelopt" in (verdict.not_covered)
    )


@pytest.mark.ranks
def test_bad_input_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="unknown quantizer 'fp9'"):
        run(quantizer="fp9")
    with pytest.raises(BadInput, match=r"block \[96, 96\] does not divide the checkpoint's hidden_size = 128"):
        run(quant_block=96)
    (tmp_path / "q.py").write_text("import torch\ndef q(w, block):\n    return w, torch.ones(1)\n")
    with pytest.raises(BadInput, match="returned a bfloat16 .* expected float8_e4m3fn"):
        run(quantizer=f"{tmp_path / 'q.py'}:q")


# ---- planted bugs ---------------------------------------------------------------------------------------------


def test_quant_catalog_is_sound() -> None:
    assert check_catalog(QUANT_MUTANTS) == []


def _finding(verdict: OracleVerdict, tensor: str, kind: str) -> str:
    return next(f.message for f in verdict.findings if (f.tensor, f.kind) == (tensor, kind))


@pytest.mark.ranks
def test_other_division_is_named_by_block_and_element() -> None:
    verdict = run(hooks=("convcheck.mutants.quant:other_division",))
    expected = differing(lambda _n, x: ref.fp8_nemo_rl(x, BLOCK), QUANTIZED)
    assert expected and kinds(verdict) == (KNOWN - {AUTOGRAD}) | expected  # the sender's own quant_fn replaces ours
    message = _finding(verdict, "model.layers.0.self_attn.q_proj.weight_scale_inv", "scale-differs")
    assert "first in block [0, 0] at index [0, 0]: got 0.0017613001400604844 (0x3ae6db6d), expected" in message


@pytest.mark.ranks
def test_per_shard_quantization_is_named() -> None:
    def halves(_name: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (q_left, s_left), (q_right, _) = ref.fp8_block(x[:, :64], BLOCK), ref.fp8_block(x[:, 64:], BLOCK)
        return torch.cat([q_left, q_right], dim=1), s_left

    verdict = run(hooks=("convcheck.mutants.quant:per_shard",))
    expected = differing(halves, [n for n in QUANTIZED if source()[n].shape[1] == 128])
    assert expected and kinds(verdict) == KNOWN | expected
    message = _finding(verdict, "model.layers.1.self_attn.q_proj.weight", "bytes-differ")
    assert "first in block [1, 0] at index [128, 85]: got -7.5 (0xcf), expected -7.0 (0xce)" in message


@pytest.mark.ranks
def test_dropped_stale_and_missing_scales_are_named() -> None:
    """Three senders' bugs in one launch (their names apart): a dropped scale, a reused scale buffer, and layer 0's fp8
    bytes without any scale."""
    hooks = tuple(f"convcheck.mutants.quant:{h}" for h in ("drop_scale", "stale_scale", "bytes_without_scales"))
    verdict = run(hooks=hooks)
    layer0 = {n for n in experts([0], suffix=SCALE) + attention(suffix=SCALE) if ".layers.0." in n}
    missing = {(n, "scale-missing") for n in layer0 | {"model.layers.1.self_attn.o_proj.weight_scale_inv"}}
    stale = "model.layers.1.mlp.experts.1.down_proj.weight_scale_inv"
    assert kinds(verdict) == {k for k in KNOWN if k[0] not in layer0} | missing | {(stale, "scale-differs")}
    assert "first in block [0, 0] at index [0, 0]: got 0.0011335100280120969 (0x3a949249)" in _finding(
        verdict, stale, "scale-differs"
    )
    assert "sent as float8_e4m3fn without its weight_scale_inv" in _finding(
        verdict, "model.layers.1.self_attn.o_proj.weight_scale_inv", "scale-missing"
    )


@pytest.mark.local_spec("the expected findings of the local layout")
@pytest.mark.ranks
def test_ignore_pattern_that_matches_too_much_is_named(tmp_path: Path) -> None:
    config = tmp_path / "quantization_config.json"
    config.write_text(json.dumps(QUANT_OVERMATCH_CONFIG))
    clean = run(quant_config=str(config))
    ignored = set(experts([0], [1]))  # bf16 as the target says: no scale, so no scale-shape finding
    assert kinds(clean) == KNOWN - {(n + SCALE, "scale-shape") for n in ignored}
    verdict = run(hooks=("convcheck.mutants.quant:ignore_overmatch",), quant_config=str(config))
    over = set(experts([0], range(10, 16)))
    assert kinds(verdict) == (kinds(clean) - {(n + SCALE, "scale-shape") for n in over}) | {
        (n, "not-quantized") for n in over
    }
    message = _finding(verdict, "model.layers.0.mlp.experts.12.up_proj.weight", "not-quantized")
    assert "the pattern 'model.layers.0.mlp.experts.1' takes model.layers.0.mlp.experts.12.up_proj only as a" in message
    assert all(f.detail.get("over_matching") == "model.layers.0.mlp.experts.1" for f in verdict.findings
               if f.kind == "not-quantized")  # fmt: skip


@pytest.mark.ranks
def test_scale_on_the_wrong_block_grid_is_named() -> None:
    coarse = {}
    for n in LAYERS:
        for e in EXPERTS:
            base = f"model.layers.{n}.mlp.experts.{e}."
            fused = torch.cat([source()[base + "gate_proj.weight"], source()[base + "up_proj.weight"]])
            q, scale = ref.fp8_block(fused, (256, 128))
            coarse[base + "gate_proj.weight"] = (q[:128], scale)
            coarse[base + "up_proj.weight"] = (q[128:], scale)
    verdict = run(hooks=("convcheck.mutants.quant:wrong_grid",))
    expected = differing(lambda name, _x: coarse[name], experts(projs="gate up"))
    assert expected and kinds(verdict) == KNOWN | expected
    message = _finding(verdict, "model.layers.0.mlp.experts.0.gate_proj.weight", "bytes-differ")
    assert "first in block [0, 0] at index [0, 0]: got 20.0 (0x5a), expected 22.0 (0x5b)" in message


# ---- every family with experts ------------------------------------------------------------------------------------

FAMILIES = {  # fixture -> (--experts, the named upstream bugs its quantized export shows at EP2, 4x4 blocks, beside
    # quant-export-autograd, which every one shows)
    "qwen3-moe": ("sequential", {"quant-expert-scale-squeezed", "quant-qkv-scale-3d"}),
    "deepseek-v3": ("sequential", {"quant-expert-scale-squeezed", "deepseek-mtp-aliases-dropped"}),
    "moonlight": ("sequential", {"quant-expert-scale-squeezed"}),
    "glm4.7-flash": ("sequential", {"quant-expert-scale-squeezed"}),
    "glm4.5": ("te-grouped", {"quant-expert-scale-squeezed", "quant-qkv-scale-3d", "glm45-mtp-aliases-dropped"}),
    "gpt-oss": ("sequential", {"quant-qkv-scale-3d", "quant-grouped-export-not-merged"}),
    "olmoe": ("te-grouped", {"quant-expert-scale-squeezed", "quant-qkv-scale-3d"}),
    "qwen3-next": (
        "sequential",
        {"quant-expert-scale-squeezed", "quant-qkv-scale-3d", "quant-mapping-not-implemented"},
    ),
    "qwen3.5-moe": (
        "te-grouped",
        {"quant-expert-scale-squeezed", "quant-qkv-scale-3d", "quant-mapping-not-implemented"},
    ),
    "qwen3.6-moe": (
        "te-grouped",
        {"quant-qkv-scale-3d", "quant-grouped-export-not-merged", "quant-mapping-not-implemented"},
    ),
    "nemotron-h": ("sequential", {"quant-mapping-not-implemented"}),
}


@pytest.mark.local_spec("the expected findings of the local layout")
@pytest.mark.ranks
@pytest.mark.parametrize("fixture", sorted(FAMILIES))
def test_every_family_with_experts_names_each_disagreement(fixture: str) -> None:
    """The bridge's quantized export of each MoE family (tiny widths, so 4x4 blocks) at EP2: every finding is a named
    upstream bug, but the tensors a stopped export never reached (`missing`, after its `export-failed`); every byte
    and scale value that was sent is the reference's."""
    experts, bugs = FAMILIES[fixture]
    bugs = bugs | {"quant-export-autograd"}  # every family's quant_fn runs with autograd on (quant_bridge.py:33)
    report = api.verify(f"tiny:{fixture}", "ep2", oracles=("quant",), experts=experts, options={"quant_block": 4},
                        spec=pinned_spec())  # fmt: skip
    (verdict,) = report.oracles
    named = {f.detail.get(UPSTREAM_BUG) for f in verdict.findings} - {None}
    assert verdict.verdict == "fail" and named == bugs
    untagged = {f.kind for f in verdict.findings if UPSTREAM_BUG not in f.detail}
    stopped = "quant-mapping-not-implemented" in bugs
    assert untagged == ({"missing"} if stopped else set())
    assert not {"bytes-differ", "scale-differs"} & {f.kind for f in verdict.findings}


@pytest.mark.ranks
def test_the_te_layouts_duplicated_mla_projections_leave_unquantized_as_a_named_bridge_bug() -> None:
    """verify's default TE layout duplicates MLA's q and kv down projections on every TP rank: the bridge's quantized
    export sends them bf16 with no scale (ReplicatedMapping never quantizes), named on each such tensor; every other
    finding is one of the bugs the local layout shows too."""
    report = api.verify("tiny:deepseek-v3", "ep2", oracles=("quant",), options={"quant_block": 4})
    (verdict,) = report.oracles
    assert all(UPSTREAM_BUG in f.detail for f in verdict.findings), [f for f in verdict.findings if not f.detail]
    named = {f.detail[UPSTREAM_BUG] for f in verdict.findings}
    assert named == FAMILIES["deepseek-v3"][1] | {"quant-export-autograd", "quant-replicated-not-quantized"}
    unquantized = sorted(f.tensor for f in verdict.findings if f.kind == "not-quantized")
    assert unquantized == sorted(f"model.layers.{n}.self_attn.{p}.weight" for n in range(5)
                                 for p in ("q_a_proj", "kv_a_proj_with_mqa"))  # fmt: skip
