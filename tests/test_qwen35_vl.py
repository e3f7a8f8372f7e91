"""Qwen3.5-VL and Qwen3.5-VL-MoE: the fixtures keep the published structure, the explicit mappings cover every
parameter once (the Qwen3.5 decoder and MTP layer under language_model, the vision tower), values planted wrong in the
real checkpoint's tensors are named by tensor and first wrong element, and the real bridges' providers satisfy the
config tables (a planted provider field is named), all without ranks; one rank run, the family's gate case
(tiny:qwen3.5-vl-moe at TP2xEP2 on the bridge's TE specs), asserts its whole verdict: every oracle passes but the two
named bridge bugs (qwen35-vl-config-export-flat, qwen35-vl-merger-gelu-tanh). The catalog's Qwen3.5-VL mutants
(convcheck.mutants.catalog_qwen35_vl) share that run as their clean run (tests/test_catalog_kills.py); the other
layouts' verdicts are recorded in docs/families.md.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch

from convcheck.compare.bits import compare_bits
from convcheck.fixtures.reference import load_layout
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mappings import GDNInProj, RankCoord
from convcheck.models import TABLES
from convcheck.models.config_rules import IGNORED, Coverage
from convcheck.models.mapping_registry import build_registry
from convcheck.models.qwen35_vl import TINY_QWEN35_VL, TINY_QWEN35_VL_MOE
from convcheck.oracles.config import check_rule, flatten, uncovered
from tests.support.helpers import matrix_run
from tests.test_mappings_gdn import ATTENTION, DENSE, GDN, moe
from tests.test_verify_matrix import assert_matches_golden

VISION_BLOCK = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
                "self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
                "self_attention.linear_proj.weight", "self_attention.linear_proj.bias", "mlp.linear_fc1.weight",
                "mlp.linear_fc1.bias", "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias",
                "mlp.linear_fc2.weight", "mlp.linear_fc2.bias")  # fmt: skip
CASES = {"qwen3.5-vl": TINY_QWEN35_VL, "qwen3.5-vl-moe": TINY_QWEN35_VL_MOE}


def megatron_names(mlp: tuple[str, ...], tied: bool) -> list[str]:
    """The TE-named parameters of the tiny VL fixtures: schedule linear x3, full; one attention MTP layer; a 2-block
    vision tower and its merger."""
    lm = [
        "embedding.word_embeddings.weight",
        "decoder.final_layernorm.weight",
        *([] if tied else ["output_layer.weight"]),
    ]
    for layer, mixer in enumerate((GDN, GDN, GDN, ATTENTION)):
        lm += [f"decoder.layers.{layer}.{p}" for p in (*mixer, *mlp)]
    lm += [f"mtp.layers.0.{p}.weight" for p in ("enorm", "hnorm", "eh_proj", "final_layernorm")]
    lm += [f"mtp.layers.0.mtp_model_layer.{p}" for p in (*ATTENTION, *mlp)]
    vision = ["patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed.weight"]
    vision += [f"decoder.layers.{b}.{p}" for b in range(2) for p in VISION_BLOCK]
    vision += [f"merger.{p}.{k}" for p in ("patch_norm", "linear_fc1", "linear_fc2") for k in ("weight", "bias")]
    return [f"language_model.{n}" for n in lm] + [f"vision_model.{n}" for n in vision]


def _checkpoint(name: str) -> Any:
    from convcheck.fixtures.build import build_fixture
    from convcheck.hf.checkpoint import open_checkpoint

    return open_checkpoint(build_fixture(f"tiny:{name}"))


def _tensors(checkpoint: Any) -> dict[str, Any]:
    """Every tensor of the checkpoint, as its shards hold it."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for shard in sorted(checkpoint.path.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def test_fixtures_keep_the_published_structure() -> None:
    """The schedule linear x3 + full, the MTP layer at the top level, mrope on a partial rotary share, no deepstack,
    tied dense / untied MoE, fused experts in the decoder and the MTP layer, the dtype in text_config,
    several shards."""
    dense, moe_ = load_layout(TINY_QWEN35_VL), load_layout(TINY_QWEN35_VL_MOE)
    names = {t["name"]: t for t in dense["tensors"]}
    assert "lm_head.weight" not in names and not any("deepstack" in n for n in names)
    assert names["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"]["shape"] == [64, 32]
    assert names["model.language_model.layers.3.self_attn.q_proj.weight"]["shape"] == [128, 32]  # query + gate
    assert names["mtp.layers.0.self_attn.q_proj.weight"]["shape"] == [128, 32] and "mtp.fc.weight" in names
    assert names["model.visual.merger.linear_fc1.weight"]["shape"] == [64, 64]
    config = json.loads(dense["config"])
    text = config["text_config"]
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"] and config["tie_word_embeddings"] is True
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] and text["mtp_num_hidden_layers"] == 1
    assert (
        text["rope_parameters"]["mrope_section"] == [2, 1, 1]
        and text["rope_parameters"]["partial_rotary_factor"] == 0.5
    )
    assert text["dtype"] == "bfloat16" and "deepstack_visual_indexes" not in config["vision_config"]
    assert len({t["file"] for t in dense["tensors"]}) > 5
    experts = {t["name"]: t["shape"] for t in moe_["tensors"] if ".experts." in t["name"]}
    assert experts["model.language_model.layers.0.mlp.experts.gate_up_proj"] == [8, 16, 32]  # [E, 2F, H]
    assert experts["mtp.layers.0.mlp.experts.down_proj"] == [8, 32, 8]  # [E, H, F]
    assert json.loads(moe_["config"])["tie_word_embeddings"] is False
    assert "lm_head.weight" in {t["name"] for t in moe_["tensors"]}


@pytest.mark.parametrize(("name", "mlp", "count"), [("qwen3.5-vl", DENSE, 85), ("qwen3.5-vl-moe", moe(True), 176)])
def test_registry_covers_the_fixture_exactly_once(name: str, mlp: tuple[str, ...], count: int) -> None:
    """Every Megatron parameter mapped once and every HF tensor produced once; the decoder in the VL spelling, the MTP
    layer at the top level, the fused experts of the decoder and the MTP layer, the merger."""
    checkpoint = _checkpoint(name)
    tied = CASES[name].config["tie_word_embeddings"]
    meg = megatron_names(mlp, tied)
    architecture = checkpoint.config["architectures"][0]
    registry = build_registry(architecture, Geometry.from_hf_config(checkpoint.config), meg, checkpoint.tensors,
                              tied=tied)  # fmt: skip
    assert len(meg) == count and set(registry.mappings) == set(meg) and registry.problems == ()
    in_proj = registry.get("language_model.decoder.layers.2.self_attention.in_proj.weight")
    assert in_proj.hf_names == tuple(
        f"model.language_model.layers.2.linear_attn.in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")
    )
    qkv = registry.get("language_model.mtp.layers.0.mtp_model_layer.self_attention.linear_qkv.weight")
    assert qkv.output_gate and qkv.q == "mtp.layers.0.self_attn.q_proj.weight"
    assert registry.get("language_model.mtp.layers.0.eh_proj.weight").hf == "mtp.fc.weight"
    assert registry.get("vision_model.merger.linear_fc1.weight").hf_names == ("model.visual.merger.linear_fc1.weight",)
    if mlp != DENSE:
        fc1 = registry.get("language_model.mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1.weight3")
        assert fc1.fused == "mtp.layers.0.mlp.experts.gate_up_proj"
        fc1 = registry.get("language_model.decoder.layers.1.mlp.experts.linear_fc1.weight3")
        assert fc1.fused == "model.language_model.layers.1.mlp.experts.gate_up_proj"


def _shard(registry: Any, megatron: str, hf: dict[str, Any], layout: ParallelLayout, coord: RankCoord) -> Any:
    return registry.get(megatron).to_shard(hf, layout, coord)


@pytest.mark.parametrize(
    ("megatron", "hf", "where", "first"),
    [
        # TP2 rank 1 of in_proj: [q_1 (8); k_1 (8); v_1 (16); z_1 (16); b_1 (2); a_1 (2)]; z row 17 is rank 1's z row 1
        ("language_model.decoder.layers.1.self_attention.in_proj.weight",
         "model.language_model.layers.1.linear_attn.in_proj_z.weight", (17, 5), [33, 5]),
        # the merger's fc1 [64, 64] is column-parallel: rank 1 holds rows 32-63
        ("vision_model.merger.linear_fc1.weight", "model.visual.merger.linear_fc1.weight", (40, 3), [8, 3]),
        # the MTP layer's gated q_proj: rank 1 holds KV group 1 ([q heads 2-3; gate 2-3; k_1; v_1]); HF row 64 is
        # head 2's query row 0 (rows 0-31: heads 0-1 with their gates), rank 1's row 0
        ("language_model.mtp.layers.0.mtp_model_layer.self_attention.linear_qkv.weight",
         "mtp.layers.0.self_attn.q_proj.weight", (64, 0), [0, 0]),
    ],
)  # fmt: skip
def test_a_value_planted_in_the_checkpoint_is_named_at_its_first_wrong_element(
    megatron: str, hf: str, where: tuple[int, int], first: list[int]
) -> None:
    """One element of a real tiny:qwen3.5-vl tensor changed: the TP2 shard the mapping makes of it differs from the
    clean shard at exactly the element the mapping puts it (GDN in_proj's z block, the merger, the MTP attention)."""
    checkpoint = _checkpoint("qwen3.5-vl")
    tensors = _tensors(checkpoint)
    registry = build_registry("Qwen3_5ForConditionalGeneration", Geometry.from_hf_config(checkpoint.config),
                              megatron_names(DENSE, True), checkpoint.tensors, tied=True)  # fmt: skip
    layout, coord = ParallelLayout(tp=2), RankCoord(tp_rank=1)
    planted = dict(tensors)
    planted[hf] = tensors[hf].clone()
    planted[hf][where] = -planted[hf][where]
    clean = _shard(registry, megatron, tensors, layout, coord)
    finding = compare_bits(megatron, clean, _shard(registry, megatron, planted, layout, coord))
    assert finding is not None and finding.tensor == megatron and finding.kind == "bytes-differ"
    assert finding.detail["first_index"] == first and finding.detail["count"] == 1
    assert isinstance(registry.get("language_model.decoder.layers.1.self_attention.in_proj.weight"), GDNInProj)


def test_a_planted_fused_expert_value_of_the_mtp_layer_is_named_in_its_expert() -> None:
    """tiny:qwen3.5-vl-moe: one element of the MTP layer's fused gate_up_proj [E, 2F, H] changed in expert 5's up
    rows is named in linear_fc1.weight5 only, at the up half's row (EP2 rank 1 holds experts 4-7)."""
    checkpoint = _checkpoint("qwen3.5-vl-moe")
    fused = "mtp.layers.0.mlp.experts.gate_up_proj"
    registry = build_registry("Qwen3_5MoeForConditionalGeneration", Geometry.from_hf_config(checkpoint.config),
                              megatron_names(moe(True), False), checkpoint.tensors)  # fmt: skip
    clean = {fused: _tensors(checkpoint)[fused]}
    planted = {fused: clean[fused].clone()}
    planted[fused][5, 8 + 2, 7] = -planted[fused][5, 8 + 2, 7]  # expert 5, up row 2 (gate rows 0-7), column 7
    layout, coord = ParallelLayout(ep=2), RankCoord(ep_rank=1)
    found = {}
    for e in range(4, 8):  # the experts EP rank 1 holds
        name = f"language_model.mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1.weight{e}"
        finding = compare_bits(name, _shard(registry, name, clean, layout, coord),
                               _shard(registry, name, planted, layout, coord))  # fmt: skip
        if finding is not None:
            found[name] = finding.detail["first_index"]
    assert found == {"language_model.mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1.weight5": [10, 7]}


# ---- the config tables, without ranks --------------------------------------------------------------------------------

PUBLISHED_EXTRAS = {"full_attention_interval", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings",
                    "attn_output_gate", "partial_rotary_factor"}  # fmt: skip
"""text_config fields published Qwen3.5 configs carry that transformers 5.12.1's classes do not declare."""


def _provider(name: str) -> tuple[Any, Any, dict[str, Any]]:
    """(HF config, the real bridge's provider, the flattened HF view) for the tiny fixture `name`."""
    import transformers

    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge import AutoBridge

    spec = CASES[name]
    cls = getattr(transformers, spec.config_class)
    hf = cls(**spec.config)
    hf.architectures = [json.loads(load_layout(spec)["config"])["architectures"][0]]
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    return hf, provider, {**flatten(cls().to_dict()), **flatten(hf.to_dict())}


def _failing(model_type: str, provider: Any, view: dict[str, Any]) -> dict[str, Any]:
    """Label -> finding of every provider-side rule (the `model.*` rules need a built model) that fails."""

    def get(field: str) -> Any:
        if not hasattr(provider, field):
            raise AttributeError(field)
        return getattr(provider, field)

    rules = [r for r in TABLES[model_type] if not r.megatron.startswith("model.")]
    return {f.tensor: f for f in (check_rule(r, view, get) for r in rules) if f is not None}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_field_is_named_and_the_real_provider_satisfies_every_rule(name: str) -> None:
    import transformers

    spec = CASES[name]
    model_type = getattr(transformers, spec.config_class).model_type
    cls = getattr(transformers, spec.config_class)
    rules = TABLES[model_type]
    named = {f for rule in rules for f in (*rule.hf, *rule.also)}
    text_fields = {*cls.sub_configs["text_config"].__annotations__, *PUBLISHED_EXTRAS}
    vision_fields = {*cls.sub_configs["vision_config"].__annotations__}
    declared = {f"text_config.{f}" for f in text_fields} | {f"vision_config.{f}" for f in vision_fields}
    top = {f for f in cls.__annotations__ if f not in ("text_config", "vision_config")}
    covered = {n.split(".")[0] + "." + n.split(".")[1] if "." in n else n for n in named}
    assert (
        sorted(
            declared
            - covered
            - {f"text_config.{f}" for f in IGNORED}
            - {f"{sub}.{f}" for sub in ("text_config", "vision_config") for f in ("initializer_range", "dtype")}
        )
        == []
    )
    assert sorted(top - covered - set(IGNORED)) == []
    source, defaults = flatten(cls(**spec.config).to_dict()), flatten(cls().to_dict())
    assert uncovered(source, defaults, Coverage(rules=rules)) == []
    _, provider, view = _provider(name)
    assert _failing(model_type, provider, view) == {}


def test_a_planted_mrope_split_rotary_share_and_gdn_head_count_are_named_by_field() -> None:
    """Planted on the real Qwen35VLBridge provider: the mrope split [1, 2, 1] for HF's [2, 1, 1], the provider's
    default rotary share 0.25 for HF's 0.5, and 2 GDN value heads where HF has 4."""
    _, provider, view = _provider("qwen3.5-vl")
    provider.mrope_section = [1, 2, 1]
    provider.rotary_percent = 0.25
    provider.linear_num_value_heads = 2
    found = _failing("qwen3_5", provider, view)
    rope = "text_config.rope_parameters -> position_embedding_type"
    heads = "text_config.linear_num_value_heads -> linear_num_value_heads"
    assert sorted(found) == sorted([rope, heads])
    assert found[rope].kind == "mismatch" and found[heads].detail["actual"] == "2"
    assert found[rope].detail["expected"] == "('mrope', 10000000.0, 0.5, [2, 1, 1])"
    assert found[rope].detail["actual"] == "('mrope', 10000000.0, 0.25, [1, 2, 1])"


def test_vl_rules_keep_the_mtp_layer_at_the_top_level() -> None:
    """The decoder's HF names move under model.language_model.; the MTP layer's stay `mtp.*` (published layout)."""
    from convcheck.models.qwen35_vl_mappings import qwen35_vl_rules

    geometry = Geometry.from_hf_config(json.loads(load_layout(TINY_QWEN35_VL)["config"]))
    name = "language_model.mtp.layers.0.mtp_model_layer.mlp.linear_fc2.weight"
    hits = [r for r in qwen35_vl_rules(True) if re.fullmatch(r.pattern, name)]
    assert len(hits) == 1
    built = hits[0].build(re.fullmatch(hits[0].pattern, name), geometry)  # type: ignore[arg-type]
    assert built.hf_names == ("mtp.layers.0.mlp.down_proj.weight",)
    assert torch.__version__  # the mapping modules need torch only at shard time


ORACLES = ("coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping")
GELU, EXPORT = "qwen35-vl-merger-gelu-tanh", "qwen35-vl-config-export-flat"


@pytest.mark.ranks
def test_qwen35_vl_moe_tp2ep2_passes_but_the_named_bugs(shared_root: Any) -> None:
    """TP2xEP2 (GDN heads, gated attention, vision tower and merger over TP; 4 experts per EP rank, the MTP layer's
    included): import, export, layout and every mapping exact, text-only logits to fp32 rounding; the config export is
    the class default's and the image logits differ by the merger GELU only (greedy tokens equal)."""
    layout = ("--tp", "2", "--ep", "2", "--spec", "te", "--experts", "auto")
    res, folder = matrix_run(shared_root, "qwen3.5-vl-moe", layout)
    assert_matches_golden("qwen3.5-vl-moe", layout, folder / "manifest.json")
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {**dict.fromkeys(ORACLES, "pass"), "config": "fail", "logits": "fail"}
    config = res.findings("config")
    assert config and {(f["kind"], f["detail"].get("upstream_bug")) for f in config} == {("roundtrip-mismatch", EXPORT)}
    assert [(f["tensor"], f["kind"], f["detail"].get("upstream_bug")) for f in res.findings("logits")] == [
        ("logits[image]", "logits-differ", GELU)
    ]
    logits = {o["name"]: o for o in res.report["oracles"]}["logits"]["metrics"]
    assert logits["max_abs_err"] < 1e-5 and logits["greedy_match"] == "32/32"
    assert 1e-4 < logits["image_max_abs_err"] < 1e-2 and logits["image_greedy_match"] == "16/16"
    mapping = {o["name"]: o for o in res.report["oracles"]}["mapping"]
    assert sum(1 for t in mapping["tensors"] if t["tensor"].startswith(("vision_model.", "language_model."))) == 176
    assert all(t["verdict"] == "pass" for t in mapping["tensors"])


def test_the_sequential_mtp_experts_bug_names_the_vl_mtp_experts_and_the_crashes_only() -> None:
    """Recorded at EP2 with `--experts sequential` (docs/families.md): the MTP layer's local experts unmapped, and the
    two crashes beside them, are the bridge bug; the decoder's local experts (which the bridge maps) and other kinds
    are not."""
    from convcheck.models import BY_HF_CLASS
    from convcheck.models.qwen35_vl import MTP_SEQUENTIAL_EXPERTS_UNMAPPED as BUG

    assert BUG in BY_HF_CLASS["Qwen3_5MoeForConditionalGeneration"].upstream_bugs
    mtp = "language_model.mtp.layers.0.mtp_model_layer.mlp.experts.local_experts.3.linear_fc2.weight"
    assert BUG.explains("0.6.2", "coverage", mtp, "unmapped")
    # the crashes are its consequences: tagged only beside the unmapped experts (an import that fails on another
    # cause, as 0.5.1's per-expert checkpoint KeyError, is not this bug)
    assert BUG.explains_consequence("0.6.2", "roundtrip", "<export>", "export-failed")
    assert BUG.explains_consequence("0.6.2", "coverage", "<import>", "import-failed")
    assert not BUG.explains("0.6.2", "coverage", "<import>", "import-failed")
    assert not BUG.explains("0.6.2", "coverage", mtp.replace("mtp.layers.0.mtp_model_layer", "decoder.layers.1"),
                            "unmapped")  # fmt: skip
    assert not BUG.explains("0.6.2", "coverage", mtp, "not-loaded")
