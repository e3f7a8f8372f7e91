"""OLMoE through the real bridge on CPU: `tiny:olmoe` (published OLMoE-1B-7B-0125 structure, tiny widths), every
default oracle, the mapping oracle against convcheck's full-width q/k norm mappings (models/olmoe_mappings.py).

Two real megatron-bridge 0.6.2 bugs, named where they apply:
- olmoe-qk-norm-full-width-under-tp (TP > 1): OLMoESelfAttention applies its num_heads * head_dim wide q/k norms to
  the rank's local partition (olmoe_provider.py:121-135, :177-180): import, export and mappings are consistent, the
  forward raises; logits names q_layernorm and the shapes;
- olmoe-sequential-experts-unmapped (SequentialMLP experts): the bridge maps experts only as grouped
  `experts.linear_fc*.weight*` (olmoe_bridge.py:115, :138-142); load and export crash.
With grouped experts (`--experts te-grouped`) TP1, EP2 and PP2 pass every oracle.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from convcheck import compat
from convcheck.compat.detect import optional_module
from convcheck.compat.no_te_olmoe import is_olmoe_layer_spec
from convcheck.compat.te_standin import te_standin_installed
from convcheck.models.olmoe import TINY_OLMOE
from tests.support.helpers import CliResult, matrix_run, mutant, run_cli
from tests.support.release_targets import skip_unless
from tests.test_verify_matrix import assert_matches_golden

ORACLES = ("coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping")
PARAMETERS = 49
"""Megatron parameters of tiny:olmoe (grouped experts), every one mapped once by the explicit rules."""
TP_BUG, SEQUENTIAL_BUG = "olmoe-qk-norm-full-width-under-tp", "olmoe-sequential-experts-unmapped"


def _verify(tmp_path: Path, *args: str) -> CliResult:
    return run_cli("verify", "--model", "tiny:olmoe", "--table", "none", *args, tmp_path=tmp_path)


def _findings(res: CliResult, oracle: str) -> list[tuple[str, str]]:
    return [(f["tensor"], f["kind"]) for f in res.findings(oracle)]


def _matrix(shared_root: Path, *layout: str) -> CliResult:
    """The verify matrix's shared run of the gate case (tests/support/cases.py FIXED), grouped experts; its manifest
    matches the golden one."""
    grouped = (*layout, "--experts", "te-grouped")
    res, folder = matrix_run(shared_root, "olmoe", grouped)
    assert_matches_golden("olmoe", grouped, folder / "manifest.json")
    return res


@pytest.mark.ranks
@pytest.mark.parametrize("layout", [(), ("--ep", "2"), ("--pp", "2")], ids=["tp1", "ep2", "pp2"])
def test_olmoe_grouped_experts_pass_every_oracle(layout: tuple[str, ...], shared_root: Path) -> None:
    res = _matrix(shared_root, *layout)
    assert res.code == 0, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == dict.fromkeys(ORACLES, "pass")
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert all(oracles[o]["checked"] > 0 for o in ORACLES)
    assert [t["verdict"] for t in oracles["mapping"]["tensors"]] == ["pass"] * PARAMETERS
    assert oracles["logits"]["metrics"]["greedy_match"] == "32/32"
    assert res.report.get("causes", []) == []


@pytest.mark.ranks
@pytest.mark.parametrize("layout", [("--tp", "2"), ("--tp", "2", "--ep", "2")], ids=["tp2", "tp2ep2"])
def test_olmoe_tp2_names_the_full_width_qk_norm_bug(layout: tuple[str, ...], shared_root: Path) -> None:
    """Import, export, layout and mappings agree (the bridge holds the full-width norm whole on every TP rank); the
    forward raises in layer 0's q_layernorm on every rank, named with its weight and input shapes."""
    res = _matrix(shared_root, *layout)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {**dict.fromkeys(ORACLES, "pass"), "logits": "fail"}
    findings = res.findings("logits")
    assert [(f["tensor"], f["kind"], f["detail"]["rank"]) for f in findings] == [
        ("decoder.layers.0.self_attention.q_layernorm.weight", "forward-failed", rank) for rank in range(len(findings))
    ]
    assert len(findings) == 2  # TP2xEP2 runs on 2 ranks too (EP over the TP ranks, ETP 1)
    first = findings[0]
    assert first["detail"]["params"] == {"decoder.layers.0.self_attention.q_layernorm.weight": [32]}
    assert first["detail"]["inputs"] == [[16, 2, 16]]
    assert "Given normalized_shape=[32]" in first["message"]
    assert {f["detail"].get("upstream_bug") for f in findings} == {TP_BUG}
    mapping = {o["name"]: o for o in res.report["oracles"]}["mapping"]
    assert [t["verdict"] for t in mapping["tensors"]] == ["pass"] * PARAMETERS
    assert [c.split(":")[0] for c in res.report["causes"]] == [
        f"{len(findings)} finding(s) are the known megatron-bridge bug {TP_BUG}"
    ]


@pytest.mark.local_spec("SequentialMLP experts, which the local layout builds")
@pytest.mark.ranks
def test_olmoe_sequential_experts_name_the_unmapped_experts(tmp_path: Path) -> None:
    """SequentialMLP experts: no bridge mapping for local_experts; load and export crash on the empty tasks."""
    res = _verify(tmp_path)
    assert res.code == 1
    assert res.verdicts() == {**dict.fromkeys(ORACLES, "fail"), "config": "pass", "differential": "pass"}
    unmapped = [f["tensor"] for f in res.findings("coverage") if f["kind"] == "unmapped"]
    assert unmapped == [
        f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc{fc}.weight"
        for layer in range(2)
        for e in range(8)
        for fc in (1, 2)
    ]
    crashes = {(f["tensor"], f["kind"]) for f in res.findings() if f["tensor"] in ("<import>", "<export>")}
    assert crashes == {("<import>", "import-failed"), ("<export>", "export-failed")}
    tagged = {f["detail"].get("upstream_bug") for f in res.findings() if f["kind"] in ("unmapped", "import-failed")}
    assert tagged == {SEQUENTIAL_BUG}
    causes = [c.split(":")[0] for c in res.report["causes"]]
    assert len(causes) == 1 and causes[0].endswith(f"the known megatron-bridge bug {SEQUENTIAL_BUG}")


@pytest.mark.ranks
def test_olmoe_symmetric_qk_norm_swap_and_expert_order_are_named(tmp_path: Path) -> None:
    """q_norm <-> k_norm in every layer and layer 0's experts 0 <-> 1, both made in import and export alike: roundtrip
    passes, mapping names each tensor and its first wrong element, logits the changed forward (one shared launch)."""
    hooks = ("--hook", mutant("olmoe", "qk_norms_swapped"), "--hook", mutant("olmoe", "experts_misordered"))
    res = _verify(tmp_path, "--experts", "te-grouped", *hooks)
    assert res.code == 1
    assert res.verdicts() == {**dict.fromkeys(ORACLES, "pass"), "logits": "fail", "mapping": "fail"}
    assert _findings(res, "logits") == [("logits", "logits-differ")]
    wrong = {(f["tensor"], f["kind"]): f["detail"] for f in res.findings("mapping")}
    imports = sorted(name for name, kind in wrong if kind == "import-bytes-differ")
    assert imports == sorted(
        [f"decoder.layers.{n}.self_attention.{qk}_layernorm.weight" for n in range(2) for qk in "qk"]
        + [f"decoder.layers.0.mlp.experts.linear_fc{fc}.weight{e}" for fc in (1, 2) for e in range(2)]
    )
    exports = sorted(name for name, kind in wrong if kind == "export-bytes-differ")
    assert exports == sorted(
        [f"model.layers.{n}.self_attn.{qk}_norm.weight" for n in range(2) for qk in "qk"]
        + [f"model.layers.0.mlp.experts.{e}.{p}_proj.weight" for e in range(2) for p in ("gate", "up", "down")]
    )
    q_norm = next(
        f for f in res.findings("mapping") if f["tensor"] == "decoder.layers.0.self_attention.q_layernorm.weight"
    )
    assert "first at index [0]" in q_norm["message"]
    expert = next(
        f for f in res.findings("mapping") if f["tensor"] == "decoder.layers.0.mlp.experts.linear_fc1.weight0"
    )
    assert "first at index [0, 0]" in expert["message"]


@pytest.mark.ranks
def test_olmoe_qk_norm_loaded_as_split_over_tp_is_named(tmp_path: Path) -> None:
    """At TP2 each rank writes only its own heads' half of layer 0's full-width q_norm: coverage, roundtrip, layout
    and mapping name q_norm and its first wrong element (rank 0: index 16); logits still names the known TP bug."""
    res = _verify(tmp_path, "--tp", "2", "--experts", "te-grouped", "--hook", mutant("olmoe", "qk_norm_sharded"))
    assert res.code == 1
    assert res.verdicts() == {
        **dict.fromkeys(ORACLES, "fail"), "config": "pass", "differential": "pass", "elements": "pass",
    }  # fmt: skip
    q_norm, hf_q_norm = "decoder.layers.0.self_attention.q_layernorm.weight", "model.layers.0.self_attn.q_norm.weight"
    assert _findings(res, "coverage") == [(q_norm, "not-loaded")]
    assert _findings(res, "roundtrip") == [(hf_q_norm, "bytes-differ")]
    assert "16/32 elements differ; first at index [16]" in res.findings("roundtrip")[0]["message"]
    assert _findings(res, "mapping") == [(q_norm, "import-bytes-differ")] * 2
    assert "first at index [16]" in res.findings("mapping")[0]["message"]
    assert ("<layout>", "first-differing") in _findings(res, "layout")
    assert {f["detail"].get("upstream_bug") for f in res.findings("logits")} == {TP_BUG}


def test_shim24_still_needed_olmoe_layer_spec_asks_for_te() -> None:
    """Fails when the bridge's OLMoE layer spec builds without TE from its own base spec (then delete shim 24)."""
    compat.install_import_shims()
    module = optional_module("megatron.bridge.models.olmoe.olmoe_provider")
    skip_unless(module is not None, "megatron.bridge.models.olmoe.olmoe_provider")
    compat.install("cpu")
    sizes = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_query_groups": 4, "kv_channels": 8}
    provider = module.OlMoEModelProvider(**sizes, num_moe_experts=8, moe_ffn_hidden_size=16, moe_router_topk=2)
    if te_standin_installed():  # an earlier test of this worker bound the TE stand-in: the TE spec builds on it
        assert "transformer_engine_layer_spec(config)" in inspect.getsource(compat.upstream(module.default_layer_spec))
    else:
        with pytest.raises(TypeError, match="'NoneType' object is not callable"):
            compat.upstream(module.default_layer_spec)(provider)
    spec = module.olmoe_layer_spec(provider)  # shim 24: the bridge's attention on megatron-core's local spec
    assert spec.submodules.self_attention.module is module.OLMoESelfAttention
    assert is_olmoe_layer_spec(module.olmoe_layer_spec)


def _variant(folder: Path, **overrides: object) -> Path:
    """tiny:olmoe's config with `overrides`, random bf16 weights saved by transformers itself."""
    import torch
    from transformers import OlmoeConfig, OlmoeForCausalLM

    config = {key: value for key, value in TINY_OLMOE.config.items() if key != "torch_dtype"}
    torch.manual_seed(0)
    OlmoeForCausalLM(OlmoeConfig(**{**config, **overrides})).to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.mark.ranks
def test_olmoe_knobs_the_bridge_hard_codes_and_gqa_k_norm_are_named(tmp_path: Path) -> None:
    """Off the published configs: GQA (2 KV heads), norm_topk_prob true, tied embeddings, clip_qkv 8. The config
    oracle names each hard-coded knob, mapping and logits the k_layernorm built num_attention_heads wide."""
    ckpt = _variant(tmp_path / "ckpt", num_key_value_heads=2, norm_topk_prob=True, tie_word_embeddings=True,
                    clip_qkv=8.0)  # fmt: skip
    res = run_cli("verify", "--model", str(ckpt), "--experts", "te-grouped", "--oracle", "config,mapping,logits",
                  "--table", "none", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1
    assert res.verdicts() == {"config": "fail", "mapping": "fail", "logits": "fail"}
    knobs = [
        ("tie_word_embeddings", "share_embeddings_and_output_weights"),
        ("norm_topk_prob", "moe_router_pre_softmax"),
        ("clip_qkv", "num_layers"),
    ]
    assert sorted(_findings(res, "config")) == sorted(
        [(f"{hf} -> {megatron}", "mismatch") for hf, megatron in knobs]
        + [(f"{hf} (megatron_to_hf_config)", "roundtrip-mismatch") for hf, _ in knobs]
    )
    assert {f["detail"].get("upstream_bug") for f in res.findings("config")} == {"olmoe-provider-hard-codes-knobs"}
    k_norm = [f for f in res.findings("mapping") if f["kind"] == "import-shape"]
    assert [f["tensor"] for f in k_norm] == [f"decoder.layers.{n}.self_attention.k_layernorm.weight" for n in range(2)]
    assert "shape [32], expected [16]" in k_norm[0]["message"]
    assert [(f["tensor"], f["kind"]) for f in res.findings("logits")] == [
        ("decoder.layers.0.self_attention.k_layernorm.weight", "forward-failed")
    ]
    tagged = {f["detail"].get("upstream_bug") for f in [*k_norm, *res.findings("logits")]}
    assert tagged == {"olmoe-k-norm-width-ignores-kv-heads"}
