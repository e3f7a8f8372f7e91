"""GLM-5 (GlmMoeDsaForCausalLM) through the real bridge on CPU: `tiny:glm5` (the published structure: MLA with q LoRA,
the DSA indexer with its k LayerNorm and top-k below the logits oracle's 16 positions, dense-first MoE with a shared
expert and sigmoid routing with an fp32 expert bias, one MTP layer), built in the bridge's own TE layout
(convcheck.models.te_only: the DSA spec asks for TE's duplicated linear), its explicit mappings
(models/glm5_mappings.py), config table (models/glm5.py) and `--from-config` rule. Its mutants run in
tests/test_catalog_kills.py.

Known megatron-bridge 0.6.2 bugs it meets, each named and still failing:
- glm5-mtp-dropped: the bridge turns MTP off (glm5_bridge.py:90-92), the checkpoint's MTP layer is lost;
- glm5-config-export-drops-indexer-and-dense-layers: the exported config.json carries GlmMoeDsaConfig's default
  indexer widths, top-k and dense-first layer count (glm5_bridge.py:112-115, :132-134);
- glm5-indexer-rope-interleave-required: a config without `indexer_rope_interleave` builds nothing (:135);
- glm5-q-kv-a-norm-eps: the published rms_norm_eps 1e-5 on the MLA q_a / kv_a norms HF keeps at 1e-6.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import GlmMoeDsaConfig

from convcheck.errors import BadInput
from convcheck.fixtures.from_config import class_fields, read_config, shrink_file
from convcheck.fixtures.shrink import shrink_config
from convcheck.gate import GOLDEN_DIR
from convcheck.hf.geometry import Geometry
from convcheck.mappings import Replicated
from convcheck.models import UPSTREAM_BUG, tag_upstream_bugs
from convcheck.models.glm5 import GLM5_TABLE, TINY_GLM5
from convcheck.models.mapping_registry import build_registry
from convcheck.models.te_only import layer_spec_for
from convcheck.sync.fusion import Geometry as FusionGeometry
from convcheck.verdict import Finding, OracleVerdict
from tests.support.helpers import matrix_run, run_cli
from tests.test_verify_matrix import assert_matches_golden

DATA = Path(__file__).parent / "data"
ARCH = "GlmMoeDsaForCausalLM"
MTP_BUG, EXPORT_BUG = "glm5-mtp-dropped", "glm5-config-export-drops-indexer-and-dense-layers"
ROPE_FIELD_BUG, EPS_BUG = "glm5-indexer-rope-interleave-required", "glm5-q-kv-a-norm-eps"
INDEXER = {
    "linear_wq_b.weight": ("wq_b.weight", [28, 24]),
    "linear_wk.weight": ("wk.weight", [14, 32]),
    "k_norm.weight": ("k_norm.weight", [14]),
    "k_norm.bias": ("k_norm.bias", [14]),
    "linear_weights_proj.weight": ("weights_proj.weight", [2, 32]),
}
"""Megatron indexer parameter -> (HF indexer tensor, its shape in tiny:glm5: 2 heads x 14, q LoRA 24, hidden 32)."""


def _names() -> tuple[list[str], dict[str, list[int]]]:
    """The Megatron parameters of tiny:glm5's TE layout (its golden manifest's conversion tasks) and the fixture's HF
    tensors with their shapes (its stored layout)."""
    tasks = json.loads((GOLDEN_DIR / "glm5__tp2_te.json").read_text())["tasks"]
    layout = json.loads((Path(__file__).parents[1] / "convcheck/fixtures/layouts/glm5.json").read_text())
    return sorted(tasks), {t["name"]: t["shape"] for t in layout["tensors"]}


def _geometry() -> Geometry:
    return replace(Geometry.from_hf_config({**TINY_GLM5.config, "model_type": "glm_moe_dsa"}), te_spec=True)


def test_the_explicit_mappings_map_every_parameter_once_and_the_indexer_whole_on_every_rank() -> None:
    """121 Megatron parameters, the indexer's five per layer Replicated onto HF's self_attn.indexer.* of the same
    shape; what the mappings cannot produce is exactly the MTP layer the bridge builds no module for."""
    megatron, hf = _names()
    registry = build_registry(ARCH, _geometry(), megatron, hf, strict=False)
    assert len(megatron) == 121 and set(registry.mappings) == set(megatron)
    for layer in range(4):
        for name, (suffix, shape) in INDEXER.items():
            mapping = registry.get(f"decoder.layers.{layer}.self_attention.core_attention.indexer.{name}")
            assert isinstance(mapping, Replicated) and mapping.hf == f"model.layers.{layer}.self_attn.indexer.{suffix}"
            assert hf[mapping.hf] == shape
    produced_never = {p.split(":")[0] for p in registry.problems}
    mtp = {name for name in hf if name.startswith("model.layers.4.")}
    # the MTP layer's copies of embed_tokens / lm_head are produced by the embedding's and output layer's mappings
    assert produced_never == mtp - {"model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight"}
    assert len(produced_never) == 47 and all("produced 0 times" in p for p in registry.problems)


def _rule(label: str):  # type: ignore[no-untyped-def]
    return next(r for r in GLM5_TABLE if r.label == label)


def test_the_config_table_reads_the_indexer_its_schedule_and_the_unread_num_experts() -> None:
    m = {"dsa_indexer_topk_freq": 1, "dsa_indexer_skip_topk_offset": 0, "num_layers": 4}.get
    schedule = _rule("indexer_types+index_topk_freq+index_skip_topk_offset+index_topk_pattern -> dsa_indexer_topk_freq")
    every = {"indexer_types": GlmMoeDsaConfig(num_hidden_layers=4).indexer_types}
    assert schedule.expect(every, m) == schedule.observe(1, m) == ["full"] * 4
    # index_topk_freq 2 without an offset: transformers' offset defaults to 2 (configuration_glm_moe_dsa.py:143), the
    # bridge's to 0 (glm5_bridge.py:137), which megatron-core clamps to 1 (dsa.py:46): other layers share their top-k
    hf = {"indexer_types": GlmMoeDsaConfig(num_hidden_layers=6, index_topk_freq=2).indexer_types}
    m2 = {"dsa_indexer_topk_freq": 2, "dsa_indexer_skip_topk_offset": 0, "num_layers": 6}.get
    assert schedule.expect(hf, m2) == ["full", "full", "shared", "full", "shared", "full"]
    assert schedule.observe(2, m2) == ["full", "shared", "full", "shared", "full", "shared"]
    rope = _rule("indexer_rope_interleave -> dsa_indexer_rope_interleaved")
    assert rope.expect({}, m) is False and rope.expect({"indexer_rope_interleave": False}, m) is False
    assert "half-split" in rope.expect({"indexer_rope_interleave": True}, m)  # not representable: HF never interleaves
    assert _rule("num_experts -> num_moe_experts").expect({"num_experts": 256, "n_routed_experts": 8}, m) == 8
    assert {_rule(f"index_{k} -> dsa_indexer_{k}").expect(TINY_GLM5.config, m) for k in ("n_heads", "head_dim")} == {
        2,
        14,
    }
    assert _rule("<implied> -> dsa_indexer_k_norm_epsilon").expect({}, m) == 1e-6


def test_the_expert_count_is_n_routed_experts_not_the_unread_num_experts() -> None:
    """A config transformers 5.12.1 writes holds num_experts 256 beside n_routed_experts: the shape check before the
    ranks (hf.geometry) and the fused receiver's expert stacking (sync.fusion) both read the experts HF builds."""
    written = {**TINY_GLM5.config, "model_type": "glm_moe_dsa", "num_experts": 256}
    assert Geometry.from_hf_config(written).num_experts == 8
    assert FusionGeometry.from_config(written).experts == 8


def test_glm5_builds_the_te_layout_whatever_spec_is_asked() -> None:
    spec, note = layer_spec_for("local", {"architectures": [ARCH]})
    assert spec == "te" and note is not None and "TELinear" in note


def test_the_known_bugs_tag_only_their_findings() -> None:
    def verdict(name: str, tensor: str, kind: str, message: str = "m") -> OracleVerdict:
        return OracleVerdict(name=name, checked=1, findings=(Finding(tensor=tensor, kind=kind, message=message),))

    field = "AttributeError: 'GlmMoeDsaConfig' object has no attribute 'indexer_rope_interleave'"
    other = "AssertionError: AbsorbedMLA requires sequence_parallel when tensor_model_parallel_size > 1"
    eps = verdict("config", "rms_norm_eps -> layernorm_epsilon", "mismatch")
    logits = verdict("logits", "logits", "logits-differ")
    mtp = verdict("roundtrip", "model.layers.4.self_attn.indexer.wk.weight", "missing")
    layer0 = verdict("roundtrip", "model.layers.0.self_attn.indexer.wk.weight", "missing")
    tagged, _ = tag_upstream_bugs(ARCH, "0.6.2", [verdict("config", "<build>", "build-failed", field), eps, logits,
                                                   mtp, layer0])  # fmt: skip
    names = [v.findings[0].detail.get(UPSTREAM_BUG) for v in tagged]
    assert names == [ROPE_FIELD_BUG, EPS_BUG, EPS_BUG, MTP_BUG, None]  # a decoder layer's loss stays untagged
    untagged, _ = tag_upstream_bugs(ARCH, "0.6.2", [verdict("config", "<build>", "build-failed", other), logits])
    assert all(UPSTREAM_BUG not in v.findings[0].detail for v in untagged)  # another build failure, logits alone


def test_the_published_config_shrinks_with_the_indexer_mla_and_mtp_kept() -> None:
    shrunk = shrink_file(DATA / "glm-5.config.json")
    c = shrunk.spec.config
    assert {k: c[k] for k in ("index_n_heads", "index_head_dim", "index_topk")} == {
        "index_n_heads": 2,
        "index_head_dim": 14,
        "index_topk": 8,
    }
    assert (c["num_hidden_layers"], c["first_k_dense_replace"], c["num_nextn_predict_layers"]) == (4, 1, 1)
    assert c["mlp_layer_types"] == ["dense", "sparse", "sparse", "sparse"] and c["indexer_types"] == ["full"] * 4
    assert (c["q_lora_rank"], c["kv_lora_rank"], c["n_routed_experts"], c["num_experts_per_tok"]) == (24, 16, 8, 4)
    assert shrunk.spec.mtp_layers == 1 and shrunk.spec.fp32_tensors == ("e_score_correction_bias",)
    assert "indexer_rope_interleave" not in c  # transformers' class does not define it; the bridge needs it
    notes = "\n".join(shrunk.notes)
    assert (
        "index_topk 2048 -> 8" in notes and "num_hidden_layers 78 -> 4: dense x3, moe x75 -> dense x1, moe x3" in notes
    )
    assert "dropped topk_method='noaux_tc'" in notes and "dropped scoring_func='sigmoid'" in notes


def test_a_shared_indexer_schedule_is_refused_in_one_line() -> None:
    base = read_config(DATA / "glm-5.config.json")
    with pytest.raises(BadInput, match="indexer_types has 38 shared layer"):
        shrink_config({**base, "index_topk_freq": 2}, class_fields("GlmMoeDsaConfig"), name="x")


@pytest.mark.ranks
def test_glm5_tp2_fails_only_on_the_known_bridge_bugs(shared_root: Path) -> None:
    """The gate case (the bridge's TE specs on the stand-in, sequence parallelism as the DSA spec needs at TP2): the
    logits agree with HF's with the sparse selection active and every decoder tensor round-trips; every finding is the
    MTP layer the bridge drops or the indexer / dense-layer knobs its config export loses."""
    layout = ("--tp", "2", "--spec", "te", "--experts", "auto")
    res, folder = matrix_run(shared_root, "glm5", layout)
    assert_matches_golden("glm5", layout, folder / "manifest.json")
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    failing = ("coverage", "roundtrip", "config", "elements", "layout", "mapping")
    assert res.verdicts() == {**dict.fromkeys(failing, "fail"), "logits": "pass", "differential": "pass"}
    findings = res.findings()
    assert len(findings) == 5 * 49 + 6 and all(f["detail"].get(UPSTREAM_BUG) for f in findings)
    tensors = {f["tensor"] for f in findings if f["detail"][UPSTREAM_BUG] == MTP_BUG}
    assert {t for t in tensors if t.startswith("model.layers.")} == {
        n for n in _names()[1] if n.startswith("model.layers.4.")
    }
    exported = sorted(f["tensor"] for f in res.findings("config") if f["detail"][UPSTREAM_BUG] == EXPORT_BUG)
    assert exported == [f"{k} (megatron_to_hf_config)" for k in ("index_head_dim", "index_n_heads", "index_topk",
                                                                 "mlp_layer_types+first_k_dense_replace")]  # fmt: skip
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert oracles["logits"]["metrics"]["greedy_match"] == "32/32"
    assert [t["tensor"] for t in oracles["mapping"]["tensors"] if t["verdict"] == "pass"] == [
        t["tensor"] for t in oracles["mapping"]["tensors"] if not t["tensor"].startswith("model.layers.4.")
    ]


@pytest.mark.ranks
def test_the_published_config_shrunk_builds_nothing_for_want_of_indexer_rope_interleave(tmp_path: Path) -> None:
    """transformers' GlmMoeDsaConfig has no indexer_rope_interleave and the bridge reads it with no default: the
    published config (class defaults) shrunk fails to build, the failure named by the bug its message names."""
    res = run_cli("verify", "--model", f"config:{DATA / 'glm-5.config.json'}", "--oracle", "config",
                  "--table", "none", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    (finding,) = res.findings("config")
    assert (finding["tensor"], finding["kind"], finding["detail"][UPSTREAM_BUG]) == (
        "<build>",
        "build-failed",
        ROPE_FIELD_BUG,
    )
    assert "glm5_bridge.py:135" in finding["message"]
