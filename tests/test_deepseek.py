"""DeepSeek-V3-style fixtures through the real bridge on CPU (issue #34, first part): every generic oracle and the
config table run and judge; the explicit mappings convcheck lacks say `not-covered`, never pass.

Two real megatron-bridge 0.6.2 bugs, named by both fixtures where they apply:
- config: DeepSeekV3Bridge.megatron_to_hf_config drops the Yarn RoPE scaling (it reads the provider's
  yarn_rotary_scaling_factor, which the MLA provider leaves None: its factor is rotary_scaling_factor), so an exported
  config.json says rope_type "default" (conversion/model_bridge.py:732);
- tiny:deepseek-v3: the export never writes the MTP layer's embed_tokens / shared_head.head, the copies of
  model.embed_tokens and lm_head published checkpoints hold (the GLM-4.7-Flash bridge restores them,
  glm47_flash_bridge.py:116).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import mutant, run_cli

GENERIC = ("coverage", "roundtrip", "logits", "differential", "elements", "layout")
NOT_COVERED = {
    "mapping": "convcheck has no explicit mappings for DeepseekV3ForCausalLM (it has them for LlamaForCausalLM, "
    "NemotronHForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)",
}
YARN_DROPPED = ("rope_parameters.rope_type (megatron_to_hf_config)", "roundtrip-mismatch")
MTP_ALIASES = ("model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight")
LAYOUTS = [(), ("--tp", "2"), ("--ep", "2"), ("--pp", "2"), ("--tp", "2", "--ep", "2")]


def _ids(layouts: list[tuple[str, ...]]) -> list[str]:
    return ["-".join(layout) or "tp1" for layout in layouts]


@pytest.mark.ranks
@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids(LAYOUTS))
def test_moonlight_passes_every_generic_oracle_names_the_yarn_export_bug_and_says_what_it_does_not_cover(
    layout: tuple[str, ...], tmp_path: Path
) -> None:
    res = run_cli("verify", "--model", "tiny:moonlight", *layout, tmp_path=tmp_path)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.report is not None and res.report["verdict"] == "fail"
    assert res.verdicts() == {**dict.fromkeys(GENERIC, "pass"), "config": "fail", "mapping": "not-covered"}
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert {name: oracles[name]["not_covered"] for name in NOT_COVERED} == NOT_COVERED
    assert all(oracles[name]["checked"] > 0 for name in (*GENERIC, "config"))
    assert [(f["tensor"], f["kind"]) for f in res.findings()] == [YARN_DROPPED]
    assert "source 'yarn', exported 'default'" in res.findings("config")[0]["message"]
    assert "1 not covered by convcheck (mapping)" in res.out
    assert [f["detail"].get("upstream_bug") for f in res.findings()] == ["deepseek-yarn-dropped"]
    assert [c.split(":")[0] for c in res.report["causes"]] == [
        "1 finding(s) are the known megatron-bridge bug deepseek-yarn-dropped"
    ]


@pytest.mark.ranks
@pytest.mark.parametrize(
    "layout",
    [(), ("--tp", "2", "--ep", "2"), ("--pp", "2"), ("--tp", "2", "--etp", "2")],
    ids=["tp1", "tp2-ep2", "pp2", "tp2-etp2"],
)
def test_deepseek_v3_fails_on_exactly_the_mtp_aliases_the_bridge_does_not_write(
    layout: tuple[str, ...], tmp_path: Path
) -> None:
    """At PP2 the MTP layers sit on the last stage with their own copy of the embeddings (a legal replica)."""
    res = run_cli("verify", "--model", "tiny:deepseek-v3", *layout, tmp_path=tmp_path)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    failing = {"coverage", "roundtrip", "elements", "layout"}
    assert res.verdicts() == {
        **{name: "fail" if name in failing else "pass" for name in GENERIC},
        "config": "fail",
        **dict.fromkeys(NOT_COVERED, "not-covered"),
    }
    assert [(f["tensor"], f["kind"]) for f in res.findings("config")] == [YARN_DROPPED]
    kinds = {"coverage": "not-exported", "roundtrip": "missing", "elements": "never-written", "layout": "missing"}
    for oracle, kind in kinds.items():
        assert {(f["tensor"], f["kind"]) for f in res.findings(oracle)} == {(t, kind) for t in MTP_ALIASES}, oracle
    bugs = {f["tensor"]: f["detail"].get("upstream_bug") for f in res.findings()}
    assert bugs == {
        YARN_DROPPED[0]: "deepseek-yarn-dropped",
        **dict.fromkeys(MTP_ALIASES, "deepseek-mtp-aliases-dropped"),
    }
    assert [c.split(":")[0] for c in res.report["causes"]] == [
        "1 finding(s) are the known megatron-bridge bug deepseek-yarn-dropped",
        "8 finding(s) are the known megatron-bridge bug deepseek-mtp-aliases-dropped",
    ]


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
