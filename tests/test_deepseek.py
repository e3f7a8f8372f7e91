"""DeepSeek-V3-style fixtures through the real bridge on CPU (issue #34, first part): every generic oracle runs and
judges; the family parts convcheck lacks (explicit mappings, config table) say `not-covered`, never pass.

tiny:deepseek-v3 fails, truthfully: megatron-bridge 0.6.2's DeepSeek-V3 export never writes the MTP layer's
embed_tokens / shared_head.head, the copies of model.embed_tokens and lm_head published checkpoints hold (the
GLM-4.7-Flash bridge restores them, glm47_flash_bridge.py:116). tiny:moonlight (no q LoRA, no MTP) passes all of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import mutant, run_cli

GENERIC = ("coverage", "roundtrip", "logits", "differential", "elements", "layout")
NOT_COVERED = {
    "config": "convcheck has no config table for model_type 'deepseek_v3' (it has them for qwen2, qwen3, qwen3_moe, "
    "llama, nemotron_h)",
    "mapping": "convcheck has no explicit mappings for DeepseekV3ForCausalLM (it has them for LlamaForCausalLM, "
    "NemotronHForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)",
}
MTP_ALIASES = ("model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight")
LAYOUTS = [(), ("--tp", "2"), ("--ep", "2"), ("--pp", "2"), ("--tp", "2", "--ep", "2")]


def _ids(layouts: list[tuple[str, ...]]) -> list[str]:
    return ["-".join(layout) or "tp1" for layout in layouts]


@pytest.mark.ranks
@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids(LAYOUTS))
def test_moonlight_passes_every_generic_oracle_and_says_what_it_does_not_cover(
    layout: tuple[str, ...], tmp_path: Path
) -> None:
    res = run_cli("verify", "--model", "tiny:moonlight", *layout, tmp_path=tmp_path)
    assert res.code == 3, res.out[-3000:] + res.err[-2000:]
    assert res.report is not None and res.report["verdict"] == "not-covered"
    assert res.verdicts() == {**dict.fromkeys(GENERIC, "pass"), **dict.fromkeys(NOT_COVERED, "not-covered")}
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert {name: oracles[name]["not_covered"] for name in NOT_COVERED} == NOT_COVERED
    assert all(oracles[name]["checked"] > 0 for name in GENERIC)
    assert res.findings() == []
    assert "NOT COVERED tiny:moonlight" in res.out and "2 not covered by convcheck (config, mapping)" in res.out
    assert "replay:" not in res.out  # nothing failed: nothing to replay


@pytest.mark.ranks
@pytest.mark.parametrize("layout", [(), ("--tp", "2", "--ep", "2"), ("--pp", "2")], ids=["tp1", "tp2-ep2", "pp2"])
def test_deepseek_v3_fails_on_exactly_the_mtp_aliases_the_bridge_does_not_write(
    layout: tuple[str, ...], tmp_path: Path
) -> None:
    """At PP2 the MTP layers sit on the last stage with their own copy of the embeddings (a legal replica)."""
    res = run_cli("verify", "--model", "tiny:deepseek-v3", *layout, tmp_path=tmp_path)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    failing = {"coverage", "roundtrip", "elements", "layout"}
    assert res.verdicts() == {
        **{name: "fail" if name in failing else "pass" for name in GENERIC},
        **dict.fromkeys(NOT_COVERED, "not-covered"),
    }
    kinds = {"coverage": "not-exported", "roundtrip": "missing", "elements": "never-written", "layout": "missing"}
    for oracle, kind in kinds.items():
        assert {(f["tensor"], f["kind"]) for f in res.findings(oracle)} == {(t, kind) for t in MTP_ALIASES}, oracle


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
