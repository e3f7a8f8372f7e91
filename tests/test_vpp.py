"""Virtual pipeline (VPP, interleaved chunks) and uneven pipeline stages (issue #31): the layout's spelling and its
bad inputs; every default oracle at PP2xVPP2 (tied embeddings), PP2xVPP2xEP2 (experts), PP2 with stages of 1 + 3
layers, PP2xVPP2 with the embedding and loss counted as layers, and hybrid patterns split by PP2 (evenly, and 2 + 3);
a distributed checkpoint resumed across a VPP change and a reshard from a VPP source; the planted pipeline bugs (a
chunk numbered with chunk 0's offset, the tied output layer synced through the wrong chunk, an uneven split numbered
as if even), each asserted as a whole verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from convcheck.errors import BadInput
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mutants.catalog_vpp import VPP_MUTANTS
from tests.support.cases import PIPELINE_EXTRAS, VPP
from tests.support.helpers import CliResult, matrix_run, mutant, run_cli
from tests.test_verify_matrix import default_oracles

DEFAULT = ("coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping")
FOUR_LAYERS = Geometry(num_heads=4, num_query_groups=2, num_layers=4, ffn=64)
CASES = [(name, layout) for name, layouts in VPP.items() for layout in layouts] + PIPELINE_EXTRAS


# ---- the layout: spelling, validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "spec", "label"),
    [
        (ParallelLayout(pp=2, vpp=2), "pp2vpp2", "PP2xVPP2"),
        (ParallelLayout(tp=2, pp=2, vpp=2, ep=2), "tp2pp2vpp2ep2", "TP2xPP2xVPP2xEP2"),
        (ParallelLayout(pp=2, pp_first=1, pp_last=3), "pp2first1last3", "PP2xFIRST1xLAST3"),
        (ParallelLayout(pp=4, pp_first=1), "pp4first1", "PP4xFIRST1"),
        (ParallelLayout(pp=2, vpp=2, pp_embed=True, pp_loss=True), "pp2vpp2embedloss", "PP2xVPP2xEMBEDxLOSS"),
        (ParallelLayout(pp=3, pp_loss=True), "pp3loss", "PP3xLOSS"),
        (ParallelLayout(tp=2, ep=2), "tp2ep2", "TP2xEP2"),  # the existing spellings are unchanged
        (ParallelLayout(), "tp1", "TP1"),
    ],
)
def test_spec_label_and_dict_round_trip(layout: ParallelLayout, spec: str, label: str) -> None:
    assert (layout.spec, layout.label) == (spec, label)
    assert ParallelLayout.parse(spec) == layout == ParallelLayout.from_dict(layout.to_dict())
    assert ParallelLayout.parse(label) == layout


def test_dict_keeps_its_old_keys_when_the_pipeline_is_plain() -> None:
    assert ParallelLayout(tp=2, pp=2).to_dict() == {"tp": 2, "pp": 2, "ep": 1, "etp": 1, "world_size": 4}
    assert ParallelLayout(pp=2, vpp=2, pp_first=2).to_dict() == {
        "tp": 1, "pp": 2, "ep": 1, "etp": 1, "vpp": 2, "pp_first": 2, "world_size": 2,
    }  # fmt: skip
    assert ParallelLayout(pp=2, vpp=2).world_size == 2  # chunks share the ranks of their stage


def test_chunks_interleave_and_uneven_stages_split_the_rest() -> None:
    assert ParallelLayout(pp=2, vpp=2).chunk_layers(4) == [[range(0, 1), range(2, 3)], [range(1, 2), range(3, 4)]]
    assert ParallelLayout(pp=2, pp_first=1, pp_last=3).chunk_layers(4) == [[range(0, 1)], [range(1, 4)]]
    assert ParallelLayout(pp=3, pp_first=1).chunk_counts(5) == [[1], [2], [2]]
    accounted = ParallelLayout(pp=2, vpp=2, pp_embed=True, pp_loss=True)
    assert accounted.chunk_layers(2) == [[range(0, 0), range(1, 2)], [range(0, 1), range(2, 2)]]  # two empty chunks
    assert ParallelLayout(pp=3, pp_embed=True, pp_loss=True).chunk_counts(4) == [[1], [2], [1]]
    assert ParallelLayout(pp=2, vpp=2, pp_last=2).chunk_layers(6) == [
        [range(0, 2), range(3, 5)],
        [range(2, 3), range(5, 6)],
    ]


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        (ParallelLayout(vpp=2), "vpp=2 needs pp > 1 (a virtual pipeline interleaves chunks over pipeline ranks)"),
        (ParallelLayout(pp_first=1), "pp_first / pp_last need pp > 1 (they size the first and last pipeline stages)"),
        (ParallelLayout(pp=2, vpp=4), "pp*vpp=2*4 does not divide num_hidden_layers=4"),
        (
            ParallelLayout(pp=2, pp_first=1, pp_last=1),
            "pp_first=1 + pp_last=1 does not add up to num_hidden_layers=4 over pp=2 stages",
        ),
        (ParallelLayout(pp=2, pp_first=5), "pp_first=5 does not add up to num_hidden_layers=4 over pp=2 stages"),
        (
            ParallelLayout(pp=3, pp_first=2, pp_last=2),
            "pp_first=2 + pp_last=2 leaves no layers for the 1 middle stage(s) of pp=3",
        ),
        (
            ParallelLayout(pp=3, pp_first=1),
            "the 3 layers left by pp_first=1 do not split evenly over 2 middle stage chunk(s)",
        ),
        (ParallelLayout(pp=2, vpp=2, pp_first=1), "vpp=2 does not divide pp_first=1"),
        (
            ParallelLayout(pp_embed=True),
            "pp_embed / pp_loss need pp > 1 (they count the embedding / loss as a pipeline layer)",
        ),
        (
            ParallelLayout(pp=2, pp_loss=True, pp_last=2),
            "pp_embed / pp_loss cannot be combined with pp_first / pp_last",
        ),
        (ParallelLayout(pp=2, pp_embed=True), "pp=2 does not divide num_hidden_layers=4 + the embedding = 5"),
    ],
)
def test_each_impossible_pipeline_is_one_line(layout: ParallelLayout, problem: str) -> None:
    problems = layout.problems_for(FOUR_LAYERS)
    assert problems[0] == problem and len(problems) == 1 + (layout.vpp > 1 and layout.uneven)


def test_hybrid_pattern_takes_no_virtual_pipeline() -> None:
    hybrid = Geometry(num_heads=4, num_query_groups=2, num_layers=4, layer_types=("mamba", "attention") * 2)
    assert ParallelLayout(pp=2, vpp=2).problems_for(hybrid) == [
        "vpp=2 needs '|' stage separators in a hybrid layer pattern (convcheck has none)"
    ]


@pytest.mark.parametrize("bad", [0, -1, True])
def test_non_positive_pipeline_fields(bad: object) -> None:
    with pytest.raises(BadInput, match="--pp-first must be a positive integer"):
        ParallelLayout(pp=2, pp_first=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--vpp", "2"), "impossible layout VPP2: vpp=2 needs pp > 1"),
        (("--pp", "2", "--vpp", "2"), "impossible layout PP2xVPP2: pp*vpp=2*2 does not divide num_hidden_layers=2"),
        (("--pp-last", "1"), "impossible layout LAST1: pp_first / pp_last need pp > 1"),
        (("--pp", "2", "--pp-first", "1", "--pp-last", "2"), "pp_first=1 + pp_last=2 does not add up"),
        (
            ("--pp", "2", "--pp-embed"),
            "impossible layout PP2xEMBED: pp=2 does not divide num_hidden_layers=2 + the embedding = 3",
        ),
    ],
)
def test_cli_rejects_impossible_pipelines_with_exit_2(args: tuple[str, ...], line: str) -> None:
    r = run_cli("verify", "--model", "tiny:qwen2-tied", *args)
    assert r.code == 2 and r.out == "", r.err
    assert r.err.startswith("convcheck: error: ") and line in r.err and r.err.count("\n") == 1


def test_replay_line_spells_the_pipeline_flags() -> None:
    from convcheck.api import prepare

    job = prepare("tiny:qwen2-tied-4l", "pp2vpp2", oracles=("coverage",), device="cpu")
    assert job.replay_args()[:5] == ["--model", "tiny:qwen2-tied-4l", "--pp", "2", "--vpp"]
    uneven = prepare("tiny:qwen2-tied-4l", "pp2first1last3", oracles=("coverage",), device="cpu")
    assert uneven.replay_args()[2:8] == ["--pp", "2", "--pp-first", "1", "--pp-last", "3"]
    flags = prepare("tiny:qwen2-tied", "pp2vpp2embedloss", oracles=("coverage",), device="cpu")
    assert flags.replay_args()[2:8] == ["--pp", "2", "--vpp", "2", "--pp-embed", "--pp-loss"]


# ---- every default oracle at the VPP and uneven layouts (the verify matrix's shared runs) --------------------------


@pytest.mark.ranks
@pytest.mark.parametrize(("name", "layout"), CASES, ids=[f"{n}-{'-'.join(lay).replace('--', '')}" for n, lay in CASES])
def test_every_default_oracle_passes(name: str, layout: tuple[str, ...], shared_root: Path) -> None:
    res, _ = matrix_run(shared_root, name, layout)
    assert res.code == 0 and res.report is not None, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == dict.fromkeys(default_oracles(layout), "pass") == dict.fromkeys(DEFAULT, "pass")
    grid = ParallelLayout.from_dict(res.report["layout"])
    assert grid.spec == gate_spec(layout)
    mapping = next(o for o in res.report["oracles"] if o["name"] == "mapping")
    shards = {"pp2vpp2": "15/15", "pp2first1last3": "8/8", "pp2vpp2ep2": "31/31", "pp2": "16/16",
              "pp2vpp2embedloss": "8/8", "pp2first2last3": "13/13"}[grid.spec]  # fmt: skip
    if name.startswith("llama"):  # no q/k/v biases: 13 and 7 of Qwen2's 15 and 8
        shards = {"pp2vpp2": "13/13", "pp2first1last3": "7/7"}[grid.spec]
    assert mapping["metrics"]["rank0_shards_in_roundtrip"] == shards  # rank 0's stage holds what the layout says


def gate_spec(layout: tuple[str, ...]) -> str:
    from tests.support.cases import gate_case

    return gate_case("x", layout).layout.spec


# ---- distckpt across a VPP change and reshard from a VPP source: one launch ----------------------------------------


@pytest.mark.ranks
def test_distckpt_resumes_across_vpp_and_reshard_from_vpp(tmp_path: Path) -> None:
    r = run_cli("verify", "--model", "tiny:qwen2-tied-4l", "--pp", "2", "--vpp", "2", "--oracle", "distckpt,reshard",
                "--resume-layout", "pp2first1last3", "--resume-layout", "tp2", "--target-tp", "1", "--target-tp",
                "2", tmp_path=tmp_path, timeout=400)  # fmt: skip
    assert r.code == 0 and r.verdicts() == {"distckpt": "pass", "reshard": "pass"}, r.findings()
    oracles = {o["name"]: o for o in r.report["oracles"]}
    metrics = oracles["distckpt"]["metrics"]
    assert metrics["saved_at"] == "PP2xVPP2" and metrics["resumed_at"] == "PP2xFIRST1xLAST3,TP2"
    assert oracles["distckpt"]["checked"] == 150  # 50 tensors exported at the save and at each of 2 resumes
    assert oracles["reshard"]["checked"] > 0 and set(oracles["reshard"]["metrics"]) >= {"tp1", "tp2"}


# ---- the planted VPP bugs --------------------------------------------------------------------------------------------


def _run_mutant(hook: str, tmp_path: Path, layout: tuple[str, ...] = ("--pp", "2", "--vpp", "2")) -> CliResult:
    return run_cli("verify", "--model", "tiny:qwen2-tied-4l", *layout, "--timeout", "200",
                   "--hook", mutant("vpp", hook), tmp_path=tmp_path)  # fmt: skip


@pytest.mark.ranks
def test_chunk_numbered_with_chunk0_offset_is_named(tmp_path: Path) -> None:
    r = _run_mutant("chunk_offset_from_chunk0", tmp_path)
    assert r.code == 1
    assert r.verdicts() == {
        "coverage": "fail", "roundtrip": "fail", "config": "pass", "logits": "fail", "differential": "pass",
        "elements": "fail", "layout": "fail", "mapping": "fail",
    }  # fmt: skip
    coverage = {(f["tensor"], f["kind"]) for f in r.findings("coverage")}
    assert ("decoder.layers.0.self_attention.linear_qkv.weight", "claimed-twice") in coverage
    assert ("model.layers.2.self_attn.q_proj.weight", "not-exported") in coverage
    misplaced = [f for f in r.findings("coverage") if f["kind"] == "misplaced-layers"]
    assert [(f["detail"]["held"], f["detail"]["expected"]) for f in misplaced] == [([0], [2]), ([1], [3])]
    assert (
        misplaced[0]["message"]
        == "PP stage 0 chunk 1 (rank 0) holds decoder layers [0]; PP2xVPP2 puts layers [2] there"
    )
    layout = next(f for f in r.findings("layout") if f["kind"] == "first-differing")
    assert layout["detail"]["tensor"] == "model.layers.2.input_layernorm.weight"


@pytest.mark.ranks
def test_tied_output_synced_through_the_wrong_chunk_is_named(tmp_path: Path) -> None:
    r = _run_mutant("tied_output_from_first_chunk", tmp_path)
    assert r.code == 1
    assert r.verdicts() == {**dict.fromkeys(DEFAULT, "pass"), "coverage": "fail", "logits": "fail", "mapping": "fail"}
    assert [(f["tensor"], f["kind"]) for f in r.findings("coverage")] == [("output_layer.weight", "not-loaded")]
    assert "4864 elements kept their pre-load value on rank 1" in r.findings("coverage")[0]["message"]
    (shard,) = r.findings("mapping")
    assert (shard["tensor"], shard["kind"]) == ("output_layer.weight", "import-bytes-differ")
    assert "4864/4864 elements differ; first at index [0, 0]: got nan (0x7fa5)" in shard["message"]
    assert {f["kind"] for f in r.findings("logits")} == {"logits-differ", "greedy-differs"}


@pytest.mark.ranks
def test_uneven_split_numbered_as_even_is_named(tmp_path: Path) -> None:
    r = _run_mutant("uneven_offset_as_even", tmp_path, ("--pp", "2", "--pp-first", "1", "--pp-last", "3"))
    assert r.code == 1
    assert r.verdicts() == {**dict.fromkeys(DEFAULT, "fail"), "config": "pass"}
    (misplaced,) = [f for f in r.findings("coverage") if f["kind"] == "misplaced-layers"]
    assert misplaced["message"] == (
        "PP stage 1 chunk 0 (rank 1) holds decoder layers [2, 3, 4]; PP2xFIRST1xLAST3 puts layers [1, 2, 3] there"
    )
    coverage = {(f["tensor"], f["kind"]) for f in r.findings("coverage")}
    assert ("decoder.layers.4.self_attention.linear_qkv.weight", "hf-missing") in coverage
    assert ("model.layers.1.self_attn.q_proj.weight", "not-exported") in coverage
    (crash,) = [f for f in r.findings("roundtrip") if f["kind"] == "export-failed"]
    assert (
        "Object must exist on at least one PP rank at megatron/bridge/models/conversion/param_mapping.py:479"
        in (crash["message"])
    )


def test_catalog_lists_the_pipeline_mutants() -> None:
    assert [(m.name, m.fixture, m.layout) for m in VPP_MUTANTS] == [
        ("vpp_chunk_offset_from_chunk0", "tiny:qwen2-tied-4l", "pp2vpp2"),
        ("vpp_tied_output_wrong_chunk", "tiny:qwen2-tied-4l", "pp2vpp2"),
        ("uneven_offset_as_even", "tiny:qwen2-tied-4l", "pp2first1last3"),
    ]


def test_plugin_takes_the_pipeline_fields_as_keywords() -> None:
    from convcheck.pytest_plugin import _choose_layout

    plain = {"tp": 1, "pp": 1, "ep": 1, "etp": 1, "vpp": 1, "pp_first": None, "pp_last": None, "pp_embed": False,
             "pp_loss": False}  # fmt: skip
    assert _choose_layout(None, {**plain, "pp": 2, "vpp": 2}, None, ParallelLayout()) == ParallelLayout(pp=2, vpp=2)
    uneven = _choose_layout(None, {**plain, "pp": 2, "pp_first": 1, "pp_last": 3}, None, ParallelLayout())
    assert uneven == ParallelLayout.parse("pp2first1last3")
    assert _choose_layout(None, plain, None, ParallelLayout(tp=2)) == ParallelLayout(tp=2)  # all defaults: the default
    with pytest.raises(BadInput, match="give either layout='pp2' or pp_embed=, not both"):
        _choose_layout("pp2", {**plain, "pp_embed": True}, None, ParallelLayout())
