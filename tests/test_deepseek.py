"""DeepSeek-V3-style fixtures through the real bridge on CPU (issue #34): every oracle runs and judges, the mapping
oracle against convcheck's own MLA / MTP mappings (convcheck/models/deepseek_mappings.py), at TP1, TP2, EP2, PP2,
TP2xEP2 and TP2xETP2.

Two real megatron-bridge 0.6.2 bugs, named by both fixtures where they apply:
- config: DeepSeekV3Bridge.megatron_to_hf_config drops the Yarn RoPE scaling (it reads the provider's
  yarn_rotary_scaling_factor, which the MLA provider leaves None: its factor is rotary_scaling_factor), so an exported
  config.json says rope_type "default" (conversion/model_bridge.py:732);
- tiny:deepseek-v3: the export never writes the MTP layer's embed_tokens / shared_head.head, the copies of
  model.embed_tokens and lm_head published checkpoints hold (the GLM-4.7-Flash bridge restores them,
  glm47_flash_bridge.py:116). The explicit mappings produce them as copies of the embedding and lm_head, so the
  mapping oracle names them too; every parameter's shard and every other exported tensor matches.

MLA layout bugs the bridge makes identically in import and export (convcheck.mutants.mla, tests/support/hooks_mla.py)
pass roundtrip and are named by the mapping oracle, tensor and first wrong element.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import CliResult, matrix_run, mutant, run_cli
from tests.test_verify_matrix import assert_matches_golden

GENERIC = ("coverage", "roundtrip", "logits", "differential", "elements", "layout")
YARN_DROPPED = ("rope_parameters.rope_type (megatron_to_hf_config)", "roundtrip-mismatch")
MTP_ALIASES = ("model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight")
LAYOUTS = [(), ("--tp", "2"), ("--ep", "2"), ("--pp", "2"), ("--tp", "2", "--ep", "2"), ("--tp", "2", "--etp", "2")]
MLA_HOOK = f"{Path(__file__).parent / 'support' / 'hooks_mla.py'}:kv_a_latent_cut_at_nope"
PARAMETERS = {"deepseek-v3": 134, "moonlight": 93, "kimi-k2": 101}
"""Megatron parameters (and the expert-bias buffers) of each fixture, every one mapped once by the explicit rules."""


def _ids(layouts: list[tuple[str, ...]]) -> list[str]:
    return ["-".join(layout) or "tp1" for layout in layouts]


def _verify(name: str, layout: tuple[str, ...], shared_root: Path, tmp_path: Path) -> CliResult:
    """The verify matrix's shared run of a gate case (its manifest matching the golden one, known findings and all),
    else a run of its own (TP2xETP2 is no gate case)."""
    try:
        res, folder = matrix_run(shared_root, name, layout)
    except KeyError:
        return run_cli("verify", "--model", f"tiny:{name}", *layout, tmp_path=tmp_path)
    assert_matches_golden(name, layout, folder / "manifest.json")
    return res


def assert_every_parameter_mapped(res: CliResult, model: str) -> None:
    """The mapping oracle checked every parameter of the model (each row a pass) and every HF tensor the export
    wrote against the source (tiny:deepseek-v3: 171 of the 173 its mappings produce, the MTP copies missing)."""
    oracle = next(o for o in res.report["oracles"] if o["name"] == "mapping")
    hf_tensors = {"deepseek-v3": 171, "moonlight": 121, "kimi-k2": 129}[model]
    assert oracle["checked"] == PARAMETERS[model] + hf_tensors
    assert oracle["unit"] == f"names ({PARAMETERS[model]} Megatron parameters + {hf_tensors} HF tensors)"
    assert [t["verdict"] for t in oracle["tensors"]] == ["pass"] * PARAMETERS[model]
    assert oracle["metrics"]["export_vs_source"] == hf_tensors
    assert oracle["metrics"]["gathers"] == oracle["metrics"]["rebuilt_from_shards"] == 0  # every shard matched


KIMI_LAYOUTS = [("--tp", "2", "--ep", "2")]
"""tiny:kimi-k2's gate case: DeepSeek-V3's structure, whose other layouts tiny:deepseek-v3 and tiny:moonlight run (TP2
and EP2 alone were run by hand with the same verdict)."""


@pytest.mark.local_spec("the local MLA layout, as tiny:moonlight's")
@pytest.mark.ranks
@pytest.mark.parametrize("layout", KIMI_LAYOUTS, ids=_ids(KIMI_LAYOUTS))
def test_kimi_k2_passes_every_oracle_but_config_which_names_the_yarn_export_bug(
    layout: tuple[str, ...], shared_root: Path, tmp_path: Path
) -> None:
    """Kimi's knobs on DeepSeek-V3's structure (one expert group, routed_scaling_factor 2.827, yarn with beta 1/1, no
    MTP) convert bitwise and forward alike; only the yarn export (deepseek-yarn-dropped) fails."""
    res = _verify("kimi-k2", layout, shared_root, tmp_path)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {**dict.fromkeys(GENERIC, "pass"), "config": "fail", "mapping": "pass"}
    assert_every_parameter_mapped(res, "kimi-k2")
    assert [(f["tensor"], f["kind"], f["detail"].get("upstream_bug")) for f in res.findings()] == [
        (*YARN_DROPPED, "deepseek-yarn-dropped")
    ]
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert oracles["logits"]["metrics"]["greedy_match"] == "32/32"


@pytest.mark.local_spec("the local MLA layout; the TE one: tests/test_te_standin_ranks.py")
@pytest.mark.ranks
@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids(LAYOUTS))
def test_moonlight_passes_every_oracle_but_config_which_names_the_yarn_export_bug(
    layout: tuple[str, ...], shared_root: Path, tmp_path: Path
) -> None:
    res = _verify("moonlight", layout, shared_root, tmp_path)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.report is not None and res.report["verdict"] == "fail"
    assert res.verdicts() == {**dict.fromkeys(GENERIC, "pass"), "config": "fail", "mapping": "pass"}
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert all(oracles[name]["checked"] > 0 for name in (*GENERIC, "config"))
    assert_every_parameter_mapped(res, "moonlight")
    assert [(f["tensor"], f["kind"]) for f in res.findings()] == [YARN_DROPPED]
    assert "source 'yarn', exported 'default'" in res.findings("config")[0]["message"]
    assert [f["detail"].get("upstream_bug") for f in res.findings()] == ["deepseek-yarn-dropped"]
    assert [c.split(":")[0] for c in res.report["causes"]] == [
        "1 finding(s) are the known megatron-bridge bug deepseek-yarn-dropped"
    ]
    assert "not covered" not in res.out


@pytest.mark.ranks
@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids(LAYOUTS))
def test_deepseek_v3_fails_on_exactly_the_mtp_aliases_the_bridge_does_not_write(
    layout: tuple[str, ...], shared_root: Path, tmp_path: Path
) -> None:
    """At PP2 the MTP layers sit on the last stage with their own copy of the embeddings (a legal replica)."""
    res = _verify("deepseek-v3", layout, shared_root, tmp_path)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    failing = {"coverage", "roundtrip", "elements", "layout"}
    assert res.verdicts() == {
        **{name: "fail" if name in failing else "pass" for name in GENERIC},
        "config": "fail",
        "mapping": "fail",
    }
    assert [(f["tensor"], f["kind"]) for f in res.findings("config")] == [YARN_DROPPED]
    kinds = {"coverage": "not-exported", "roundtrip": "missing", "elements": "never-written", "layout": "missing",
             "mapping": "not-exported"}  # fmt: skip
    for oracle, kind in kinds.items():
        assert {(f["tensor"], f["kind"]) for f in res.findings(oracle)} == {(t, kind) for t in MTP_ALIASES}, oracle
    bugs = {f["tensor"]: f["detail"].get("upstream_bug") for f in res.findings()}
    assert bugs == {
        YARN_DROPPED[0]: "deepseek-yarn-dropped",
        **dict.fromkeys(MTP_ALIASES, "deepseek-mtp-aliases-dropped"),
    }
    assert [c.split(":")[0] for c in res.report["causes"]] == [
        "1 finding(s) are the known megatron-bridge bug deepseek-yarn-dropped",
        "10 finding(s) are the known megatron-bridge bug deepseek-mtp-aliases-dropped",
    ]
    assert_every_parameter_mapped(res, "deepseek-v3")


@pytest.mark.local_spec("the local MLA layout; the TE one: tests/test_te_standin_ranks.py")
@pytest.mark.ranks
def test_kv_b_v_before_k_nope_in_import_and_export_passes_roundtrip_and_is_named_by_mapping(tmp_path: Path) -> None:
    """The bridge's layer-0 linear_kv_up_proj holds each head as [v; k_nope] and exports it back
    (convcheck.mutants.mla:kv_b_k_nope_v_swapped): roundtrip passes; mapping names the shard on both TP ranks at its
    first row (v's first row where k_nope's belongs) and the export it rebuilds from them."""
    res = run_cli("verify", "--model", "tiny:moonlight", "--tp", "2", "--oracle", "roundtrip,mapping",
                  "--hook", mutant("mla", "kv_b_k_nope_v_swapped"), tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"roundtrip": "pass", "mapping": "fail"}
    findings = res.findings("mapping")
    assert sorted((f["tensor"], f["kind"], f["detail"].get("rank")) for f in findings) == [
        ("decoder.layers.0.self_attention.linear_kv_up_proj.weight", "import-bytes-differ", 0),
        ("decoder.layers.0.self_attention.linear_kv_up_proj.weight", "import-bytes-differ", 1),
        ("model.layers.0.self_attn.kv_b_proj.weight", "export-bytes-differ", None),
    ]
    assert {tuple(f["detail"]["first_index"]) for f in findings} == {(0, 0)}
    rank0 = next(f for f in findings if f["detail"].get("rank") == 0)
    assert "704/704 elements differ; first at index [0, 0]" in rank0["message"]  # 2 heads x 22 rows x 16


@pytest.mark.ranks
def test_kv_a_latent_cut_at_the_wrong_offset_is_named_by_mapping_in_every_layer_and_the_mtp_layer(
    tmp_path: Path,
) -> None:
    """The bridge's linear_kv_down_proj cuts the KV latent after 12 rows (qk_head_dim, not kv_lora_rank 16) in import
    and export (tests/support/hooks_mla.py): rows 12-23 are wrong in each decoder layer and in the MTP layer
    (model.layers.4); roundtrip names only the MTP copies the bridge never writes, which mapping names too."""
    res = run_cli("verify", "--model", "tiny:deepseek-v3", "--oracle", "roundtrip,mapping", "--hook", MLA_HOOK,
                  tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"roundtrip": "fail", "mapping": "fail"}
    assert {(f["tensor"], f["kind"]) for f in res.findings("roundtrip")} == {(t, "missing") for t in MTP_ALIASES}
    findings = [f for f in res.findings("mapping") if f["kind"] != "not-exported"]
    assert {f["tensor"] for f in res.findings("mapping") if f["kind"] == "not-exported"} == set(MTP_ALIASES)
    layers = [f"decoder.layers.{i}" for i in range(4)] + ["mtp.layers.0.mtp_model_layer"]
    assert sorted((f["tensor"], f["kind"]) for f in findings) == sorted(
        [(f"{layer}.self_attention.linear_kv_down_proj.weight", "import-bytes-differ") for layer in layers]
        + [(f"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight", "export-bytes-differ") for i in range(5)]
    )
    assert {tuple(f["detail"]["first_index"]) for f in findings} == {(12, 0)}
    assert all("384/768 elements differ" in f["message"] for f in findings)  # 12 rows x 32 columns


@pytest.mark.local_spec("the local MLA layout; the TE one: tests/test_te_standin_ranks.py")
@pytest.mark.ranks
def test_a_planted_bug_in_a_deepseek_model_is_named(tmp_path: Path) -> None:
    """The real bridge's row-parallel export transposed (convcheck.mutants.bridge:transpose_o_proj) on an MLA model."""
    res = run_cli(
        "verify", "--model", "tiny:moonlight", "--tp", "2", "--oracle", "coverage,roundtrip",
        "--hook", mutant("bridge", "transpose_o_proj"), tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"coverage": "pass", "roundtrip": "fail"}
    [finding] = res.findings("roundtrip")
    assert (finding["tensor"], finding["kind"]) == ("model.layers.0.self_attn.o_proj.weight", "shape")
    assert finding["message"] == (
        "shape [40, 32], expected [32, 40]; diagnosis: export is the source transposed ([in, out] instead of [out, in])"
    )  # MLA's o_proj is [hidden, heads x v_head_dim]: 32 x 40


@pytest.mark.ranks
def test_a_planted_config_bug_in_a_deepseek_model_is_named_by_field(tmp_path: Path) -> None:
    """The router picks 3 experts where the HF config says 4 (convcheck.mutants.config:router_topk)."""
    res = run_cli(
        "verify", "--model", "tiny:moonlight", "--oracle", "config", "--hook", mutant("config", "router_topk"),
        tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert {(f["tensor"], f["kind"]) for f in res.findings("config")} == {
        ("num_experts_per_tok -> moe_router_topk", "mismatch"),
        ("num_experts_per_tok (megatron_to_hf_config)", "roundtrip-mismatch"),
        ("num_experts_per_tok+topk_group (megatron_to_hf_config)", "roundtrip-mismatch"),
        YARN_DROPPED,
    }


def test_the_table_names_what_megatron_cannot_express() -> None:
    """HF's fixed q_a / kv_a norm eps (GLM-4.7-Flash publishes rms_norm_eps 1e-5), uninterleaved RoPE and a group
    score Megatron computes otherwise are named, not passed (no ranks: the rules over a config view)."""
    import json

    from convcheck.fixtures import get_spec
    from convcheck.fixtures.reference import load_layout
    from convcheck.models.deepseek import DEEPSEEK_V3_TABLE
    from convcheck.oracles.config import check_rule, flatten

    view = flatten(json.loads(load_layout(get_spec("deepseek-v3"))["config"]))
    megatron = {"layernorm_epsilon": 1e-5, "multi_latent_attention": True, "moe_router_group_topk": 2}

    def failing(**hf: object) -> set[str]:
        return {
            f.tensor for rule in DEEPSEEK_V3_TABLE if rule.megatron in megatron
            for f in [check_rule(rule, {**view, **hf}, megatron.get)] if f is not None
        }  # fmt: skip

    assert failing(rms_norm_eps=1e-5) == {"rms_norm_eps -> layernorm_epsilon"}
    assert failing(rms_norm_eps=1e-5, rope_interleave=False) == {
        "rms_norm_eps -> layernorm_epsilon", "rope_interleave -> multi_latent_attention",
    }  # fmt: skip
    assert failing(rms_norm_eps=1e-5, num_experts_per_tok=6) == {
        "rms_norm_eps -> layernorm_epsilon", "num_experts_per_tok+topk_group -> moe_router_group_topk",
    }  # fmt: skip


@pytest.mark.ranks
def test_deepseek_v3_sync_reshard_and_distckpt_at_tp2_ep2_fail_only_on_the_known_bridge_bug(tmp_path: Path) -> None:
    """Every weight-sync, reshard and distributed-checkpoint oracle on TP2xEP2: the only findings are the MTP aliases
    the bridge never exports (tagged as that known bug); the HF receiver drops the MTP layer's other tensors, which
    transformers builds no module for, and counts them."""
    res = run_cli(
        "verify", "--model", "tiny:deepseek-v3", "--tp", "2", "--ep", "2",
        "--oracle", "receiver,idempotence,delta,broadcast,distckpt,reshard",
        "--target-tp", "1", "--target-tp", "2", "--target-ep", "1", "--target-ep", "2",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {
        "receiver": "fail", "idempotence": "pass", "delta": "pass", "broadcast": "pass", "distckpt": "fail",
        "reshard": "pass",
    }  # fmt: skip
    found = {(o, f["tensor"], f["kind"], f["detail"].get("upstream_bug")) for o in ("receiver", "distckpt")
             for f in res.findings(o)}  # fmt: skip
    assert found == {
        (o, t, kind, "deepseek-mtp-aliases-dropped")
        for t in MTP_ALIASES
        for o, kind in (("receiver", "not-delivered"), ("distckpt", "missing"))
    }
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert oracles["receiver"]["metrics"] == {"not_held": 42}
    assert oracles["reshard"]["checked"] > 0 and oracles["distckpt"]["checked"] > 0
