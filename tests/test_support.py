"""`convcheck support`: the enumeration of the bridge's registered architectures, the generic shrink, a one-row
table end to end, a planted bug the row names, bad input, and the shape of the generated docs/support.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from convcheck.fixtures.support_shrink import HEAD_DIM, HIDDEN, VOCAB, shrink_tree
from convcheck.workflows import support as workflow
from tests.support.helpers import ROOT, mutant, run_cli

LANGUAGE_MODELS = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM",
                   "Qwen3VLMoeForConditionalGeneration")  # fmt: skip


def test_shrink_keeps_ratios_patterns_and_nested_configs() -> None:
    """Widths small, the query / key-value head ratio kept (MHA, GQA, MQA), a layer pattern cut to its period, a
    nested text_config shrunk too, token ids moved below the vocabulary."""
    config = {
        "model_type": "x", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "num_hidden_layers": 48, "vocab_size": 151936, "num_experts": 128,
        "num_experts_per_tok": 8, "moe_intermediate_size": 768, "eos_token_id": 151645, "pad_token_id": 0,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"],
        "text_config": {"model_type": "y", "hidden_size": 2048, "num_attention_heads": 16,
                        "num_key_value_heads": 16, "num_hidden_layers": 36},
        "vision_config": {"model_type": "v", "hidden_size": 1152, "num_heads": 16, "depth": 27,
                          "deepstack_visual_indexes": [8, 16, 24]},
    }  # fmt: skip
    out = shrink_tree(config)
    assert (out["hidden_size"], out["num_attention_heads"], out["num_key_value_heads"], out["head_dim"]) == (
        HIDDEN, 4, 2, HEAD_DIM)  # fmt: skip
    assert (out["num_experts"], out["num_experts_per_tok"], out["moe_intermediate_size"]) == (4, 2, 32)
    assert out["num_hidden_layers"] == 6 and out["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert (out["vocab_size"], out["eos_token_id"], out["pad_token_id"]) == (VOCAB, VOCAB - 1, 0)
    assert out["text_config"] == {"model_type": "y", "hidden_size": HIDDEN, "num_attention_heads": 4,
                                  "num_key_value_heads": 4, "num_hidden_layers": 2}  # fmt: skip
    assert (out["vision_config"]["depth"], out["vision_config"]["deepstack_visual_indexes"]) == (2, [0])
    assert shrink_tree({"num_attention_heads": 8, "num_key_value_heads": 1})["num_key_value_heads"] == 1


def test_a_layer_list_that_does_not_repeat_keeps_its_shortest_prefix_with_every_kind() -> None:
    """ERNIE 4.5 VL's one dense layer then 27 sparse ones, and a per-modality list of expert widths: 2 layers (dense,
    sparse), the widths scaled together to at most 128 in steps of 16 (the text / vision ratio kept); a pattern that
    repeats keeps its period, one that does not repeat and has one kind keeps LAYERS."""
    text = {"model_type": "ernie4_5_vl_moe_text", "num_hidden_layers": 28,
            "mlp_layer_types": ["dense"] + ["sparse"] * 27, "moe_intermediate_size": [1536, 512]}  # fmt: skip
    out = shrink_tree(text)
    assert (out["num_hidden_layers"], out["mlp_layer_types"], out["moe_intermediate_size"]) == (
        2, ["dense", "sparse"], [128, 48])  # fmt: skip
    hybrid = shrink_tree({"num_hidden_layers": 12, "hybrid_override_pattern": "M-M-M-MM*-M-"})
    assert (hybrid["num_hidden_layers"], hybrid["hybrid_override_pattern"]) == (9, "M-M-M-MM*")
    assert shrink_tree({"num_hidden_layers": 9, "layer_types": ["full"] * 9})["num_hidden_layers"] == 2


@pytest.mark.fresh_process
def test_every_enumerated_architecture_gets_a_config_or_a_reason() -> None:
    """The child lists every architecture the installed bridge registers; each language-model class transformers has
    gets a shrunk default config or a one-line reason, and the common families shrink as documented."""
    from convcheck.fixtures.support_child import config_or_reason

    rows = workflow.enumerate_architectures()
    names = [r["arch"] for r in rows]
    assert len(names) >= 40 and set(LANGUAGE_MODELS) <= set(names) and names == sorted(names)
    for row in rows:
        if "not_covered" in row:
            assert "\n" not in row["not_covered"] and row["not_covered"], row
            continue
        config, reason = config_or_reason(row["arch"])
        assert (config is None) == bool(reason) and "\n" not in reason, (row, reason)
    shrunk = {arch: config_or_reason(arch)[0] for arch in LANGUAGE_MODELS}
    llama = shrunk["LlamaForCausalLM"]
    assert (llama.hidden_size, llama.num_hidden_layers, llama.vocab_size, llama.head_dim) == (64, 2, VOCAB, 16)
    moe = shrunk["Qwen3MoeForCausalLM"]
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (4, 2, 32)
    assert shrunk["Gemma3ForCausalLM"].num_hidden_layers == 6  # five sliding layers and a full one
    text = shrunk["Qwen3VLMoeForConditionalGeneration"].text_config
    assert (text.hidden_size, text.num_experts, shrunk["Qwen3VLMoeForConditionalGeneration"].vision_config.depth) == (
        64, 4, 2)  # fmt: skip


def _report(verdicts: dict[str, str], bug: str = "") -> dict:
    finding = {"tensor": "t", "kind": "k", "message": "m", "detail": {"upstream_bug": bug}}
    return {"exit": 0 if not bug else 1, "report": {"oracles": [
        {"name": n, "verdict": v, "checked": 1, "findings": [finding] if v == "fail" else []}
        for n, v in verdicts.items()]}}  # fmt: skip


def test_pass_all_generic_counts_each_layout_and_known_fail_rows() -> None:
    """A row passes every generic oracle when each passed in every layout, its config / mapping verdicts aside (a
    known-fail row on a config bug counts); a layout with no report, or one generic oracle failing, does not."""
    generic = dict.fromkeys(workflow.GENERIC_ORACLES, "pass")
    entry = {"arch": "XForCausalLM", "model_type": "x"}
    config_bug = workflow.row_from_runs(entry, [("tp2", _report({**generic, "config": "fail"}, bug="b")),
                                                ("ep2", _report({**generic, "config": "fail"}, bug="b"))])  # fmt: skip
    assert (config_bug.status, config_bug.generic_pass) == (workflow.KNOWN_FAIL, True)
    logits_bug = workflow.row_from_runs(entry, [("tp2", _report({**generic, "logits": "fail"}, bug="b"))])
    assert (logits_bug.status, logits_bug.generic_pass) == (workflow.KNOWN_FAIL, False)
    one_layout = workflow.row_from_runs(entry, [("tp2", {"exit": 2, "error": "e"}), ("ep2", _report(generic))])
    assert (one_layout.status, one_layout.generic_pass) == (workflow.NOT_COVERED, False)
    assert one_layout.verdicts == dict.fromkeys(workflow.GENERIC_ORACLES, "not-covered")
    clean = workflow.row_from_runs(entry, [("tp2", _report({**generic, "config": "not-covered"}))])
    assert (clean.status, clean.generic_pass) == (workflow.PASS, True)
    assert workflow.counts([config_bug, logits_bug, one_layout, clean]) == {
        "rows": 4, "pass": 1, "pass_generic": 2, "known_fail": 2, "not_covered": 1, "untagged_fail": 0,
        "outside": 0}  # fmt: skip


def test_a_release_without_the_api_an_oracle_checks_leaves_it_not_covered() -> None:
    """Bridge 0.3.0 has no megatron_to_hf_config: the config oracle's `not-supported` finding makes the row's config
    verdict not covered, never an untagged FAIL; the row's other findings still decide it."""
    finding = {"tensor": "<megatron_to_hf_config>", "kind": "not-supported",
               "message": "megatron-bridge 0.3.0 has no megatron_to_hf_config to check", "detail": {}}  # fmt: skip
    generic = dict.fromkeys(workflow.GENERIC_ORACLES, "pass")
    report = {"exit": 1, "report": {"oracles": [
        *({"name": n, "verdict": v, "checked": 1, "findings": []} for n, v in generic.items()),
        {"name": "config", "verdict": "fail", "checked": 0, "findings": [finding]}]}}  # fmt: skip
    row = workflow.row_from_runs({"arch": "LlamaForCausalLM", "model_type": "llama"}, [("tp2", report)])
    assert (row.status, row.generic_pass, row.verdicts["config"], row.findings) == (
        workflow.PASS, True, "not-covered", [])  # fmt: skip


@pytest.mark.fresh_process
def test_unknown_arch_is_one_line_exit_2() -> None:
    res = run_cli("support", "--arch", "NoSuchForCausalLM")
    assert res.code == 2 and res.out == ""
    assert res.err.strip().splitlines() == [
        "convcheck: error: --arch 'NoSuchForCausalLM' is not registered in the installed megatron-bridge "
        f"({res.err.split('(')[1].split()[0]} architectures; `convcheck support --json F` lists them)"
    ]


def test_rerun_without_resume_and_a_bad_table_are_one_line_exit_2(tmp_path: Path) -> None:
    res = run_cli("support", "--rerun", "LlamaForCausalLM")
    assert (res.code, res.out, res.err) == (
        2, "", "convcheck: error: --rerun needs --resume (the table whose rows it replaces)\n")  # fmt: skip
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    res = run_cli("support", "--resume", str(bad))
    assert (res.code, res.out) == (2, "") and res.err.startswith(f"convcheck: error: {bad} is not a table written by")
    assert len(res.err.splitlines()) == 1


@pytest.mark.ranks
def test_support_llama_end_to_end_is_a_pass_row(tmp_path: Path) -> None:
    """One architecture through the whole command: built from transformers' default LlamaConfig, verified at TP2,
    every oracle passes; the JSON and the Markdown agree."""
    out, md = tmp_path / "t.json", tmp_path / "t.md"
    res = run_cli("support", "--arch", "LlamaForCausalLM", "--json", str(out), "--markdown", str(md), timeout=600)
    assert res.code == 0, res.err[-3000:]
    table = json.loads(out.read_text())
    (row,) = table["rows"]
    assert (row["arch"], row["model_type"], row["status"], row["layouts"], row["bugs"]) == (
        "LlamaForCausalLM", "llama", "pass", ["tp2"], [])  # fmt: skip
    assert row["verdicts"] == dict.fromkeys(row["verdicts"], "pass") and set(workflow.GENERIC_ORACLES) <= set(
        row["verdicts"])  # fmt: skip
    assert table["counts"] == {"rows": 1, "pass": 1, "pass_generic": 1, "known_fail": 0, "not_covered": 0,
                               "untagged_fail": 0, "outside": 0}  # fmt: skip
    assert re.search(r"^pass +LlamaForCausalLM \(llama\) coverage=pass", res.err, re.M), res.err
    assert "| LlamaForCausalLM | llama | pass | tp2 |" in md.read_text()


@pytest.mark.ranks
def test_a_planted_bug_is_a_fail_row_naming_the_tensor() -> None:
    """The row machinery on a real verify of the support checkpoint with the bridge's o_proj export transposed: an
    untagged FAIL naming the tensor and the finding kind."""
    entry = {"arch": "LlamaForCausalLM", "model_type": "llama"}
    built = workflow._child(["build", entry["arch"], str(workflow.checkpoint_root())], 600)
    hook = ["--oracle", "roundtrip", "--hook", mutant("bridge", "transpose_o_proj")]
    run = workflow.run_verify(built["folder"], ["--tp", "2"], 300, hook)
    row = workflow.row_from_runs(entry, [("tp2", run)])
    assert (row.status, row.verdicts, row.bugs) == (workflow.FAIL, {"roundtrip": "fail"}, [])
    assert row.reason.startswith("tp2 roundtrip: model.layers.0.self_attn.o_proj.weight [bytes-differ] "), row.reason


def _doc_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| architecture")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]


def test_support_md_is_generated_and_its_counts_match_its_rows() -> None:
    """docs/support.md: the generated header naming the command, counts that match the table, no untagged FAIL row
    (0 false alarms), a reason on every row that is not a pass."""
    text = (ROOT / "docs" / "support.md").read_text()
    assert re.search(r"^<!-- generated by `convcheck support [^`]*--markdown docs/support.md`", text, re.M)
    rows = _doc_rows(text)
    counts = {k: int(v) for k, v in re.findall(r"^- ([a-zA-Z -]+): (\d+)", text, re.M)}
    statuses = [r[2] for r in rows]
    assert counts["rows"] == len(rows) > 0
    assert counts["pass"] == statuses.count("pass")
    assert counts["FAIL-with-known-upstream-bug"] == statuses.count("known-fail")
    assert counts["not-covered"] == statuses.count("not-covered")
    assert counts["untagged FAIL"] == statuses.count("FAIL")
    assert [r[0] for r in rows if r[2] == "FAIL"] == [], "a FAIL no known bug explains: triage it"
    generic = [r for r in rows if r[2] in ("pass", "known-fail") and r[4:10] == ["pass"] * 6]
    assert counts["pass-all-generic"] == len(generic)
    assert all(r[-1] for r in rows if r[2] != "pass"), [r for r in rows if r[2] != "pass" and not r[-1]]


def test_the_logits_reference_of_an_audio_wrapper_is_its_own_class() -> None:
    """The HF side of the logits oracle loads a checkpoint through the auto class that has its config: causal LMs,
    vision-language wrappers (image-text-to-text) and Qwen2-Audio (a multimodal LM, no causal-LM entry)."""
    import transformers

    from convcheck.oracles.hf_stream import lm_auto_class

    assert lm_auto_class(transformers.Qwen3Config()) is transformers.AutoModelForCausalLM
    assert lm_auto_class(transformers.Qwen3VLConfig()) is transformers.AutoModelForImageTextToText
    assert lm_auto_class(transformers.Qwen2AudioConfig()) is transformers.AutoModelForMultimodalLM


def test_a_speech_out_wrapper_gets_its_logits_from_its_thinker_and_its_default_config_builds() -> None:
    """Qwen3-Omni's ForConditionalGeneration has no forward (generate() runs the thinker, then the talker): the logits
    oracle's HF side calls its thinker; a model with a forward is called itself. transformers cannot build the class's
    own default config (the talker reads shared_expert_intermediate_size and spatial_merge_size its config classes
    lack); the shrunk one names them and builds."""
    import torch
    import transformers

    from convcheck.fixtures.support_child import default_config
    from convcheck.oracles.hf_stream import logits_module

    arch = "Qwen3OmniMoeForConditionalGeneration"
    with torch.device("meta"):
        with pytest.raises(AttributeError, match="shared_expert_intermediate_size"):
            getattr(transformers, arch)(transformers.Qwen3OmniMoeConfig())
        omni = getattr(transformers, arch)(default_config(arch))
        qwen3 = transformers.Qwen3ForCausalLM(default_config("Qwen3ForCausalLM"))
    assert logits_module(omni) is omni.thinker and logits_module(qwen3) is qwen3
    talker = omni.config.talker_config
    assert (talker.spatial_merge_size, talker.text_config.shared_expert_intermediate_size) == (2, 32)


def test_implied_mrope_sections_are_scaled_so_transformers_builds_the_tiny_model() -> None:
    """Ernie 4.5 VL names no mrope_section; its modeling code assumes [22, 22, 20] (128-wide heads). The shrink
    writes them scaled to the 16-wide heads' rotary half, and transformers then builds the tiny model on the CPU
    (without them it raised at modeling_ernie4_5_vl_moe.py:115, a row convcheck's own shrink made not-covered);
    a config naming its sections gets them scaled too."""
    import torch
    import transformers

    from convcheck.fixtures.support_child import default_config

    config = default_config("Ernie4_5_VLMoeForConditionalGeneration")
    assert config.text_config.rope_parameters["mrope_section"] == [3, 3, 2]
    with torch.device("cpu"):
        model = transformers.Ernie4_5_VLMoeForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) > 0
    named = shrink_tree({"model_type": "x", "hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128,
                         "rope_parameters": {"rope_type": "default", "mrope_section": [24, 20, 20]}})  # fmt: skip
    assert named["rope_parameters"]["mrope_section"] == [3, 3, 2]


def test_a_row_finished_after_the_run_was_cancelled_is_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancelled run (SIGINT / SIGTERM, or a device's time limit) stops the running verifies mid-way: the rows they
    give (`verify exit 143`) are no verdicts, so neither the progress line nor the saved table gets them."""
    entries = [{"arch": "AForCausalLM", "model_type": "a"}, {"arch": "BForCausalLM", "model_type": "b"}]

    def row(entry: dict, *_args: object) -> workflow.Row:
        if entry["arch"] == "BForCausalLM":
            workflow._CANCELLED.set()  # the run is cancelled while B's verify runs
        return workflow.Row(arch=entry["arch"], status=workflow.NOT_COVERED, reason="tp2: verify exit 143")

    monkeypatch.setattr(workflow, "support_row", row)
    saved: list[list[str]] = []
    shown: list[str] = []
    try:
        workflow.run_support(entries, jobs=1, timeout=60, progress=lambda r: shown.append(r.arch),
                             saved=lambda rows: saved.append([r.arch for r in rows]))  # fmt: skip
    finally:
        workflow._CANCELLED.clear()
    assert shown == ["AForCausalLM"] and saved == [["AForCausalLM"]]


def test_the_ernie_vl_router_as_transformers_writes_it_passes_the_input_check(tmp_path: Path) -> None:
    """transformers writes Ernie 4.5 VL's router `mlp.gate.weight` as published, [hidden, experts] (its
    conversion_mapping.py transposes it on load): convcheck's config/weights shape check opens that checkpoint (before,
    it rejected the row as a config mismatch, exit 2); the same tensors under another model_type still fail the
    check, naming the first router."""
    import torch
    import transformers

    from convcheck.errors import BadInput
    from convcheck.fixtures.support_child import default_config
    from convcheck.hf.checkpoint import open_checkpoint
    from convcheck.hf.shapes import check_config_shapes

    config = default_config("Ernie4_5_VLMoeForConditionalGeneration")
    with torch.device("cpu"):
        model = transformers.Ernie4_5_VLMoeForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    checkpoint = open_checkpoint(tmp_path)
    gates = sorted(n for n in checkpoint.tensors if n.endswith("mlp.gate.weight"))
    hidden, experts = config.text_config.hidden_size, config.text_config.moe_num_experts
    assert gates and {tuple(checkpoint.tensors[n].shape) for n in gates} == {(hidden, experts)}
    with pytest.raises(BadInput, match=rf"^config/weights shape mismatch: tensor '{re.escape(gates[0])}' .* implies "
                                       rf"\[{experts}, {hidden}\]"):  # fmt: skip
        check_config_shapes({**checkpoint.config, "model_type": "qwen3_moe"}, checkpoint.tensors)
