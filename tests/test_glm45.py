"""GLM-4.5 / 4.6 (Glm4MoeForCausalLM) through the real bridge on CPU: tiny:glm4.5 (q/k norms, per-expert tensors as
save_pretrained writes them) and tiny:glm4.5-air (no q/k norms, experts stored fused: the bridge's other expert path).

Two real megatron-bridge 0.6.2 bugs, named where they apply:
- glm45-mtp-aliases-dropped (every layout): the export never writes the MTP layer's embed_tokens / shared_head.head
  copies (glm45_bridge.py has no export hook, unlike glm47_flash_bridge.py:116);
- glm45-sequential-experts-unmapped (SequentialMLP experts): the bridge maps routed experts only in the grouped layout
  (glm45_bridge.py:166-192, :238-278), so load and export crash. With `--experts te-grouped` (TEGroupedMLP's names,
  what a GPU build with TE gives) every parameter converts bitwise and the logits match HF.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cases import FIXED
from tests.support.helpers import CliResult, matrix_run, mutant, run_cli
from tests.test_verify_matrix import assert_matches_golden

ALIASES_BUG = "glm45-mtp-aliases-dropped"
SEQUENTIAL_BUG = "glm45-sequential-experts-unmapped"
ALIASES = ("model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight")
ALIAS_KINDS = {
    "coverage": "not-exported",
    "roundtrip": "missing",
    "elements": "never-written",
    "layout": "missing",
    "mapping": "not-exported",
}
"""The one finding each oracle makes per MTP alias: the export never writes it."""
PARAMETERS = {"glm4.5": 124, "glm4.5-air": 114}
"""Megatron parameters of each fixture (4 layers, the first dense, and one MTP layer), each mapped once."""


def _verify(model: str, *args: str, tmp_path: Path) -> CliResult:
    return run_cli("verify", "--model", f"tiny:{model}", "--table", "none", *args, tmp_path=tmp_path, timeout=600)


def _unknown(res: CliResult) -> list[tuple[str, str, str]]:
    """(oracle, tensor, kind) of every finding no known bug explains."""
    return [
        (o["name"], f["tensor"], f["kind"])
        for o in res.report["oracles"]
        for f in o.get("findings", [])
        if "upstream_bug" not in f.get("detail", {})
    ]


def _unknown_elements(res: CliResult) -> list[tuple[str, str, str, list[int] | None, int | None]]:
    """(oracle, tensor, kind, first wrong element, rank) of every finding no known bug explains."""
    return [
        (o["name"], f["tensor"], f["kind"], f.get("detail", {}).get("first_index"), f.get("detail", {}).get("rank"))
        for o in res.report["oracles"]
        for f in o.get("findings", [])
        if "upstream_bug" not in f.get("detail", {})
    ]


def _elementwise(res: CliResult, oracle: str) -> dict[str, tuple[str, list[int] | None]]:
    return {f["tensor"]: (f["kind"], f.get("detail", {}).get("first_index")) for f in res.findings(oracle)}


GROUPED = [(name, layout) for name in ("glm4.5", "glm4.5-air") for layout in FIXED[name] if "te-grouped" in layout]
"""The verify matrix's TEGroupedMLP cases (tests/support/cases.py): TP2, PP2, EP2, TP2xEP2; Air at TP2xEP2."""


@pytest.mark.ranks
@pytest.mark.parametrize(
    ("model", "layout"), GROUPED, ids=[f"{n}-{'-'.join(a[:-2]).replace('--', '')}" for n, a in GROUPED]
)
def test_te_grouped_experts_convert_bitwise_but_for_the_mtp_aliases(
    model: str, layout: tuple[str, ...], shared_root: Path
) -> None:
    res, folder = matrix_run(shared_root, model, layout)  # the verify matrix's shared run
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {**dict.fromkeys(ALIAS_KINDS, "fail"), "config": "pass", "logits": "pass",
                              "differential": "pass"}  # fmt: skip
    for oracle, kind in ALIAS_KINDS.items():
        assert [(f["tensor"], f["kind"]) for f in res.findings(oracle)] == [(a, kind) for a in ALIASES], oracle
    assert _unknown(res) == []
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert [t["verdict"] for t in oracles["mapping"]["tensors"]] == ["pass"] * PARAMETERS[model]
    assert oracles["logits"]["metrics"]["greedy_match"] == "32/32"
    assert float(oracles["logits"]["metrics"]["max_abs_err"]) < 1e-6
    assert [c.split(":")[0] for c in res.report["causes"]] == [
        f"10 finding(s) are the known megatron-bridge bug {ALIASES_BUG}"
    ]
    assert_matches_golden(model, layout, folder / "manifest.json")


@pytest.mark.ranks
def test_sequential_experts_name_the_unmapped_local_experts(tmp_path: Path) -> None:
    """SequentialMLP experts (moe_grouped_gemm off, or no TE): the bridge has no mapping for any local_experts
    parameter, its load and export crash on the empty conversion tasks, and the run names the bug."""
    res = _verify("glm4.5", "--experts", "sequential", tmp_path=tmp_path)
    assert res.code == 1
    assert res.verdicts() == {
        **dict.fromkeys(("coverage", "roundtrip", "logits", "elements", "layout", "mapping"), "fail"),
        "config": "pass",
        "differential": "pass",
    }
    unmapped = [f["tensor"] for f in res.findings("coverage") if f["kind"] == "unmapped"]
    layers = [f"decoder.layers.{n}" for n in (1, 2, 3)] + ["mtp.layers.0.mtp_model_layer"]
    assert sorted(unmapped) == sorted(
        f"{layer}.mlp.experts.local_experts.{e}.linear_fc{fc}.weight"
        for layer in layers
        for e in range(8)
        for fc in (1, 2)
    )
    crashes = {(f["tensor"], f["kind"]) for f in res.findings() if f["tensor"] in ("<import>", "<export>")}
    assert crashes == {("<import>", "import-failed"), ("<export>", "export-failed")}
    tagged = {f["detail"].get("upstream_bug") for f in res.findings() if f["kind"] in ("unmapped", "import-failed")}
    assert tagged == {SEQUENTIAL_BUG}
    causes = [c.split(":")[0] for c in res.report["causes"]]
    assert any(c.endswith(f"the known megatron-bridge bug {SEQUENTIAL_BUG}") for c in causes)


@pytest.mark.ranks
def test_qkv_bias_interleave_and_expert_bias_at_init_are_named(tmp_path: Path) -> None:
    """Two planted bugs in one TP2 launch: the q/k/v bias concatenated instead of interleaved per query group
    (symmetric: roundtrip exact, the mapping oracle names every layer's shard at element 24, the first k row of group
    0), and layer 2's fp32 expert bias left at its init on import."""
    res = _verify("glm4.5", "--tp", "2", "--experts", "te-grouped", "--oracle", "coverage,roundtrip,mapping",
                  "--hook", mutant("glm45", "qkv_bias_not_interleaved"),
                  "--hook", mutant("glm45", "expert_bias_left_at_init"), tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1
    assert res.verdicts() == dict.fromkeys(("coverage", "roundtrip", "mapping"), "fail")
    qkv = [f"decoder.layers.{n}" for n in range(4)] + ["mtp.layers.0.mtp_model_layer"]
    expected = [
        ("coverage", "decoder.layers.2.mlp.router.expert_bias", "not-loaded", None, 0),
        ("roundtrip", "model.layers.2.mlp.gate.e_score_correction_bias", "bytes-differ", [0], None),
        # TP rank 0 holds [q0 (2 heads x 12); k0; v0], where the bug puts q heads 2-3 from element 24; rank 1
        # holds group 1's q heads, where the bug puts k
        *(
            ("mapping", f"{layer}.self_attention.linear_qkv.bias", "import-bytes-differ", first, rank)
            for layer in qkv
            for rank, first in ((0, [24]), (1, [0]))
        ),
        *(("mapping", "decoder.layers.2.mlp.router.expert_bias", "import-bytes-differ", [0], rank) for rank in (0, 1)),
        *(
            (
                "mapping",
                f"model.layers.{n}.self_attn.{p}_proj.bias",
                "export-bytes-differ",
                [24] if p == "q" else [0],
                None,
            )
            for n in range(5)
            for p in "kqv"
        ),
    ]
    assert sorted(_unknown_elements(res), key=repr) == sorted(expected, key=repr)


@pytest.mark.ranks
def test_mtp_source_layer_partial_rotary_and_bias_dtype_are_named(tmp_path: Path) -> None:
    """Three planted bugs in one TP1 launch: the MTP layer's q/k/v mapped to the last decoder layer's HF tensors, the
    partial rotary factor lost in the provider, and the fp32 expert bias exported as bf16."""
    res = _verify("glm4.5", "--experts", "te-grouped", "--oracle", "coverage,roundtrip,mapping,config",
                  "--hook", mutant("glm45", "mtp_qkv_from_last_decoder_layer"),
                  "--hook", mutant("glm45", "partial_rotary_lost"),
                  "--hook", mutant("bridge", "downcast_router_bias"), tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1
    assert res.verdicts() == dict.fromkeys(("coverage", "roundtrip", "mapping", "config"), "fail")
    mtp = [f"model.layers.4.self_attn.{p}_proj.weight" for p in "kqv"]
    last = [f"model.layers.3.self_attn.{p}_proj.weight" for p in "kqv"]
    coverage = {(f["tensor"], f["kind"]) for f in res.findings("coverage") if f["tensor"] not in ALIASES}
    assert coverage == {*((t, "duplicate") for t in last), *((t, "not-exported") for t in mtp)}
    roundtrip = _elementwise(res, "roundtrip")
    biases = [f"model.layers.{n}.mlp.gate.e_score_correction_bias" for n in (1, 2, 3, 4)]
    assert {t: k for t, (k, _) in roundtrip.items() if t not in ALIASES} == {
        **dict.fromkeys(mtp, "missing"),
        **dict.fromkeys(biases, "dtype"),
    }
    mapping = _elementwise(res, "mapping")
    assert mapping["mtp.layers.0.mtp_model_layer.self_attention.linear_qkv.weight"] == ("import-bytes-differ", [0, 0])
    assert {t for t, (k, _) in mapping.items() if k == "export-dtype"} == set(biases)
    config = {f["tensor"]: f["kind"] for f in res.findings("config")}
    rule = "partial_rotary_factor+rope_parameters.partial_rotary_factor"
    assert config == {f"{rule} -> rotary_percent": "mismatch", f"{rule} (megatron_to_hf_config)": "roundtrip-mismatch"}


def test_the_bridges_te_free_decoder_block_spec_is_kept() -> None:
    """The GLM-4.5 bridge binds megatron-core's decoder block spec to its HAVE_TE (glm45_bridge.py:63): without TE
    the CPU provider keeps it (dense-first layers from moe_layer_freq), where a TE one is replaced by the local spec."""
    from functools import partial

    from convcheck import compat

    compat.install_import_shims()  # shim 1: megatron.bridge imports TE unconditionally (peft/lora_layers.py:20)
    from megatron.bridge.models.glm import glm45_bridge
    from megatron.bridge.models.gpt_provider import local_layer_spec
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    from convcheck.compat.provider import keeps_te_free_block_spec

    assert keeps_te_free_block_spec(partial(get_gpt_decoder_block_spec, use_transformer_engine=False))
    assert not keeps_te_free_block_spec(partial(get_gpt_decoder_block_spec, use_transformer_engine=True))
    assert not keeps_te_free_block_spec(local_layer_spec)
    assert glm45_bridge.HAVE_TE is False  # what the bridge binds here (no Transformer Engine installed)
