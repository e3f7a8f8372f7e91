"""tiny:glm4.7-flash (Glm4MoeLiteForCausalLM, issue #34) through the real GLM47FlashBridge on CPU: every default
oracle passes at every layout, the mapping oracle against DeepSeek's explicit mappings (the MTP layer's copies of the
embedding and lm_head included).

The bridge's export hook (glm47_flash_bridge.py:116 maybe_modify_converted_hf_weight) writes the MTP layer's
embed_tokens / shared_head.head copies after megatron_to_hf; the probe follows it (convcheck.probe.hook), so the
elements and differential oracles check those copies instead of calling them never written, and a bug planted in the
hook is still named (convcheck.mutants.mtp).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.helpers import matrix_run, mutant, run_cli

GENERIC = ("coverage", "roundtrip", "logits", "differential", "elements", "layout")
EMBED_ALIAS, HEAD_ALIAS = "model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight"
ELEMENTS = 129192
"""Every element of the 173 source tensors, the two MTP aliases' 2 x 152 x 32 included."""
LAYOUTS = [(), ("--tp", "2"), ("--ep", "2"), ("--pp", "2"), ("--tp", "2", "--ep", "2")]


@pytest.mark.ranks
@pytest.mark.parametrize("layout", LAYOUTS, ids=["-".join(layout) or "tp1" for layout in LAYOUTS])
def test_glm_passes_every_oracle(layout: tuple[str, ...], shared_root: Path) -> None:
    res, _ = matrix_run(shared_root, "glm4.7-flash", layout)  # the verify matrix's run (golden manifest checked there)
    assert res.code == 0, res.out[-3000:] + res.err[-2000:]
    assert res.report is not None and res.report["verdict"] == "pass"
    assert res.verdicts() == {**dict.fromkeys(GENERIC, "pass"), "config": "pass", "mapping": "pass"}
    assert res.findings() == []
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert all(oracles[name]["checked"] > 0 for name in (*GENERIC, "config"))
    assert oracles["elements"]["checked"] == oracles["differential"]["checked"] == ELEMENTS
    rows = {row["tensor"]: row["verdict"] for row in oracles["elements"]["tensors"]}
    assert rows[EMBED_ALIAS] == rows[HEAD_ALIAS] == "pass"
    assert oracles["mapping"]["checked"] == 134 + 173  # every parameter, every exported tensor (the copies too)
    assert oracles["mapping"]["metrics"]["export_vs_source"] == 173


@pytest.mark.ranks
def test_the_probe_follows_the_hook_before_any_export_ran(tmp_path: Path) -> None:
    """Named first, elements and differential probe on their own (no export drain has set up the bridge yet); the
    exports after them are untouched by the hook calls the probe made (PP2: the aliases come from the last stage)."""
    res = run_cli(
        "verify", "--model", "tiny:glm4.7-flash", "--pp", "2", "--oracle", "elements,differential,coverage,roundtrip",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 0, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == dict.fromkeys(("elements", "differential", "coverage", "roundtrip"), "pass")
    assert res.findings() == []
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert oracles["differential"]["metrics"]["real"] == "own conversions"
    assert oracles["elements"]["checked"] == oracles["differential"]["checked"] == ELEMENTS


@pytest.mark.ranks
def test_a_hook_that_swaps_the_mtp_aliases_is_named_by_tensor_and_element(tmp_path: Path) -> None:
    """Each alias is still written exactly once (elements, differential pass: the probe sees what the export does),
    but with the other tensor's values: roundtrip names both at their first element."""
    res = run_cli(
        "verify", "--model", "tiny:glm4.7-flash", "--tp", "2", "--oracle", "coverage,roundtrip,differential,elements",
        "--hook", mutant("mtp", "mtp_aliases_swapped"), tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"coverage": "pass", "roundtrip": "fail", "differential": "pass", "elements": "pass"}
    found = {(f["tensor"], f["kind"], f["message"].split(";")[1].strip()) for f in res.findings()}
    assert found == {
        (EMBED_ALIAS, "bytes-differ", "first at index [0, 0]: got 4.291534423828125e-05 (0x3834), expected "
         "-0.00010061264038085938 (0xb8d3)"),
        (HEAD_ALIAS, "bytes-differ", "first at index [0, 0]: got -0.00010061264038085938 (0xb8d3), expected "
         "4.291534423828125e-05 (0x3834)"),
    }  # fmt: skip


@pytest.mark.ranks
def test_the_mapping_oracle_names_swapped_mtp_aliases_against_the_embedding_and_lm_head(tmp_path: Path) -> None:
    """The explicit mappings rebuild each MTP copy from the shard it repeats: the swapped copies are named, each at
    its first element, against the embedding's and lm_head's rows; every parameter's shard still matches."""
    res = run_cli(
        "verify", "--model", "tiny:glm4.7-flash", "--tp", "2", "--oracle", "mapping",
        "--hook", mutant("mtp", "mtp_aliases_swapped"), tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"mapping": "fail"}
    found = {(f["tensor"], f["kind"], f["detail"]["megatron"], tuple(f["detail"]["first_index"]))
             for f in res.findings()}  # fmt: skip
    assert found == {
        (EMBED_ALIAS, "export-bytes-differ", "embedding.word_embeddings.weight", (0, 0)),
        (HEAD_ALIAS, "export-bytes-differ", "output_layer.weight", (0, 0)),
    }
    oracle = res.report["oracles"][0]
    assert {row["verdict"] for row in oracle["tensors"]} == {"pass"}  # shards all right: the export hook is wrong


@pytest.mark.ranks
def test_a_hook_that_drops_an_mtp_alias_is_named_by_every_oracle_that_counts_tensors(tmp_path: Path) -> None:
    """The probe follows the hook, so elements names the dropped copy as never written (not a false alarm now: the
    export really lacks it); the differential passes, the probe and the export agreeing that nothing writes it."""
    res = run_cli(
        "verify", "--model", "tiny:glm4.7-flash", "--tp", "2", "--oracle", "coverage,roundtrip,differential,elements",
        "--hook", mutant("mtp", "mtp_head_alias_dropped"), tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"coverage": "fail", "roundtrip": "fail", "differential": "pass", "elements": "fail"}
    assert [(f["tensor"], f["kind"]) for f in res.findings()] == [
        (HEAD_ALIAS, "not-exported"), (HEAD_ALIAS, "missing"), (HEAD_ALIAS, "never-written"),
    ]  # fmt: skip
    assert res.findings("elements")[0]["detail"]["first_index"] == [0, 0]


def test_the_glm_table_names_what_megatron_cannot_express() -> None:
    """No ranks: the rules over the fixture's config view with the Megatron values the bridge sets for it. HF's
    fixed q_a / kv_a eps (published rms_norm_eps 1e-5), an mlp_layer_types the bridge's first_k_dense_replace does not
    give, and partial RoPE under Megatron's Yarn rotary are named; Yarn with factor 1 is plain RoPE."""
    from convcheck.fixtures import get_spec
    from convcheck.fixtures.reference import load_layout
    from convcheck.models.glm import GLM_TABLE
    from convcheck.oracles.config import check_rule, flatten

    view = flatten(json.loads(load_layout(get_spec("glm4.7-flash"))["config"]))
    megatron = {
        "layernorm_epsilon": 1e-6, "moe_layer_freq": [0, 1, 1, 1], "num_layers": 4, "rope_type": "yarn",
        "rotary_scaling_factor": 1.0, "rotary_percent": 1.0, "moe_router_enable_expert_bias": True,
        "moe_router_group_topk": 1,
    }  # fmt: skip

    def failing(megatron_changes: dict | None = None, **hf: object) -> set[str]:
        get = {**megatron, **(megatron_changes or {})}.get
        return {
            f.tensor for rule in GLM_TABLE if rule.megatron in megatron
            for f in [check_rule(rule, {**view, **hf}, get)] if f is not None
        }  # fmt: skip

    assert failing() == set()
    assert failing(rms_norm_eps=1e-5) == {"rms_norm_eps -> layernorm_epsilon"}
    dense_two = ["dense", "dense", "sparse", "sparse"]  # what the bridge would need first_k_dense_replace 2 for
    assert failing(mlp_layer_types=dense_two) == {"mlp_layer_types+first_k_dense_replace -> moe_layer_freq"}
    assert failing({"moe_layer_freq": [0, 0, 1, 1]}, mlp_layer_types=dense_two) == set()
    assert failing({"rotary_scaling_factor": 4.0}) == {"rope_parameters.rope_type -> rope_type"}
    assert failing(**{"rope_parameters.partial_rotary_factor": 0.5}) == {
        "rope_parameters.partial_rotary_factor -> rotary_percent"
    }
    assert failing({"rope_type": "rope", "rotary_percent": 0.5}, **{"rope_parameters.partial_rotary_factor": 0.5}) == (
        set()
    )
    assert failing({"moe_router_group_topk": 2}, n_group=4, topk_group=2, num_experts_per_tok=6) == {
        "num_experts_per_tok+topk_group -> moe_router_group_topk"
    }


def test_the_glm_table_covers_every_field_of_the_config_class_and_of_the_fixture() -> None:
    """Every Glm4MoeLiteConfig field (and the extra ones published configs carry) has a rule or a reason to be
    ignored, and nothing the fixture's config.json sets is left uncovered."""
    import transformers

    from convcheck.fixtures import get_spec
    from convcheck.fixtures.reference import load_layout
    from convcheck.models import TABLES
    from convcheck.models.config_rules import IGNORED, Coverage
    from convcheck.oracles.config import flatten, uncovered

    rules = TABLES["glm4_moe_lite"]
    fields = {*transformers.Glm4MoeLiteConfig.__annotations__, "qk_head_dim", "first_k_dense_replace",
              "num_nextn_predict_layers", "topk_method", "partial_rotary_factor"}  # fmt: skip
    named = {f.split(".")[0] for rule in rules for f in (*rule.hf, *rule.also)}
    assert sorted(fields - named - set(IGNORED)) == []
    source = flatten(json.loads(load_layout(get_spec("glm4.7-flash"))["config"]))
    defaults = flatten(transformers.Glm4MoeLiteConfig().to_dict())
    assert uncovered(source, defaults, Coverage(rules=rules)) == []


def test_the_bridge_builds_the_layer_pattern_from_first_k_dense_replace_and_the_table_names_it() -> None:
    """Real GLM47FlashBridge, no ranks: a Glm4MoeLiteConfig whose mlp_layer_types has two dense layers (and no
    first_k_dense_replace) gets moe_layer_freq [0, 1, 1, 1] (glm47_flash_bridge.py:106-107 reads only
    first_k_dense_replace, default 1) and the moe_layer_freq rule names it; back the other way, megatron_to_hf_config
    writes neither field, so two dense layers come back as one. The fixture, like the published config, has both
    agree (one dense layer), where neither direction differs."""
    import transformers

    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge import AutoBridge
    from megatron.bridge.models.glm.glm47_flash_bridge import GLM47FlashBridge

    from convcheck.models.glm import GLM_TABLE, TINY_GLM47_FLASH
    from convcheck.oracles.config import check_rule, flatten

    config = {k: v for k, v in TINY_GLM47_FLASH.config.items() if k != "first_k_dense_replace"}
    hf = transformers.Glm4MoeLiteConfig(**config, mlp_layer_types=["dense", "dense", "sparse", "sparse"])
    hf.architectures = ["Glm4MoeLiteForCausalLM"]
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    assert provider.moe_layer_freq == [0, 1, 1, 1]
    [rule] = [r for r in GLM_TABLE if r.megatron == "moe_layer_freq"]
    finding = check_rule(rule, flatten(hf.to_dict()), lambda name: getattr(provider, name))
    assert finding is not None and finding.tensor == "mlp_layer_types+first_k_dense_replace -> moe_layer_freq"
    assert finding.detail["expected"] == "[0, 0, 1, 1]" and finding.detail["actual"] == "[0, 1, 1, 1]"
    provider.moe_layer_freq = [0, 0, 1, 1]
    exported = GLM47FlashBridge.megatron_to_hf_config(provider)
    assert "first_k_dense_replace" not in exported and "mlp_layer_types" not in exported
    assert transformers.Glm4MoeLiteConfig(**exported).mlp_layer_types == ["dense", "sparse", "sparse", "sparse"]
