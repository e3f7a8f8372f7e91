"""`convcheck support --retag`: a recorded table re-tagged with today's known bugs. The committed tables of the gated
releases (bench/results/) are the evidence the bugs named after those runs explain what the runs saw."""

from __future__ import annotations

import json
from pathlib import Path

from convcheck.workflows import support as workflow
from convcheck.workflows.support_retag import parse_finding, retag, retag_row
from tests.support.helpers import ROOT, run_cli

RESULTS = ROOT / "bench" / "results"


def _table(release: str) -> list[workflow.Row]:
    return workflow.load_rows(RESULTS / f"h100-cpu-support-bridge-{release}-2026-12-07.json")


def test_a_recorded_line_parses_back_to_its_finding() -> None:
    """The line row_from_runs records (tensor names hold spaces, arrows, brackets-free text) gives back layout, oracle,
    tensor, kind and message; a finding-less FAIL line gives None."""
    line = ("tp2 config: rope_parameters.sliding_attention+rope_parameters.full_attention (megatron_to_hf_config) "
            "[roundtrip-mismatch] Gemma3ModelBridge.megatron_to_hf_config gives x [1]")  # fmt: skip
    layout, oracle, finding = parse_finding(line)
    assert (layout, oracle, finding.kind) == ("tp2", "config", "roundtrip-mismatch")
    assert finding.tensor == "rope_parameters.sliding_attention+rope_parameters.full_attention (megatron_to_hf_config)"
    assert finding.message == "Gemma3ModelBridge.megatron_to_hf_config gives x [1]"
    assert parse_finding("tp2 logits: FAIL with no finding (checked 3)") is None


def test_the_bugs_named_after_the_older_release_runs_explain_what_they_saw() -> None:
    """Re-tagged, the 0.5.1 and 0.4.2 tables' rows the triage named become known-fail with exactly those bugs; what
    stays FAIL is what a re-tag cannot settle (findings the run did not record, or convcheck's own fixed limits)."""
    expected = {
        "0.5.1": {
            "GemmaForCausalLM": ["gemma-exact-gelu"],
            "Gemma4ForCausalLM": ["gemma4-dense-built-as-moe"],
            "NemotronHForCausalLM": [
                "transformers-nemotron-h-embedding-saved-singular",
                "nemotronh-mtp-pattern-export-raises",
                "nemotronh-mtp-pattern-without-mtp-layers",
            ],  # fmt: skip
        },
        "0.4.2": {
            "Gemma3ForCausalLM": ["te-post-layernorm-default-eps", "gemma3-config-export-drops-window-and-local-rope"],
            "GptOssForCausalLM": ["gpt-oss-config-export-raises", "router-aux-loss-coef-unmapped"],
        },
    }
    still_fail = {
        "0.5.1": {"Gemma3ForConditionalGeneration", "Qwen2_5OmniForConditionalGeneration", "Qwen3_5MoeForCausalLM",
                  "Qwen3_5MoeForConditionalGeneration"},
        "0.4.2": {"MiniMaxM2ForCausalLM", "NemotronHForCausalLM", "Qwen2AudioForConditionalGeneration",
                  "Qwen2_5OmniForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                  "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"},
    }  # fmt: skip
    counts = {
        "0.5.1": {"rows": 38, "pass": 10, "pass_generic": 16, "known_fail": 22, "not_covered": 2, "untagged_fail": 4,
                  "outside": 14},
        "0.4.2": {"rows": 27, "pass": 7, "pass_generic": 10, "known_fail": 13, "not_covered": 0, "untagged_fail": 7,
                  "outside": 7},
    }  # fmt: skip
    for release, named in expected.items():
        before = {r.arch: r for r in _table(release)}
        after = {r.arch: r for r in retag(list(before.values()), release)}
        for arch, bugs in named.items():
            assert before[arch].status == workflow.FAIL, (release, arch)
            row = after[arch]
            assert (row.status, sorted(row.bugs), row.findings) == (workflow.KNOWN_FAIL, sorted(bugs), []), arch
            assert row.reason == "known upstream bug(s): " + ", ".join(row.bugs)
            assert row.verdicts == before[arch].verdicts  # verdicts as run
        assert {a for a, r in after.items() if r.status == workflow.FAIL} == still_fail[release], release
        assert workflow.counts(list(after.values())) == counts[release]


def test_a_bug_of_another_release_explains_nothing_and_unrecorded_findings_keep_the_row_failing() -> None:
    """The 0.5.1 Gemma row re-tagged as if run on 0.6.2 (where gemma-exact-gelu is fixed) keeps its finding; a row whose
    recorded findings are all explained but that had more than it recorded stays FAIL and says so."""
    gemma = next(r for r in _table("0.5.1") if r.arch == "GemmaForCausalLM")
    assert retag_row(gemma, "0.6.2", "5.12.1") == gemma
    omni = next(r for r in _table("0.5.1") if r.arch == "Qwen2_5OmniForConditionalGeneration")
    row = retag_row(omni, "0.5.1", "5.8.1")
    assert row.status == workflow.FAIL and row.findings == []
    assert row.reason.endswith("2192 more untagged finding(s) were not recorded by the run")


def test_retag_cli_writes_the_table_and_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    table = RESULTS / "h100-cpu-support-bridge-0.4.2-2026-12-07.json"
    out, md = tmp_path / "t.json", tmp_path / "t.md"
    res = run_cli("support", "--resume", str(table), "--retag", "0.4.2", "--json", str(out), "--markdown", str(md))
    assert res.code == 1 and res.out.startswith("rows=27 pass=7 pass_generic=10 known_fail=13 not_covered=0 "
                                                "untagged_fail=7")  # fmt: skip
    assert json.loads(out.read_text())["counts"]["untagged_fail"] == 7
    assert "megatron-bridge 0.4.2, megatron-core 0.17.1, transformers 5.3.0" in md.read_text()
    for args, message in (
        (("--retag", "0.4.2"), "--retag takes exactly one --resume table and no --arch / --rerun"),
        (("--resume", str(table), "--retag", "9.9"), "unknown bridge release '9.9'"),
    ):
        res = run_cli("support", *args)
        assert (res.code, res.out) == (2, ""), args
        assert res.err.startswith(f"convcheck: error: {message}") and len(res.err.splitlines()) == 1, res.err


def test_the_0_6_0_0_5_0_0_4_0_tables_and_their_reruns_retag_to_their_named_bugs() -> None:
    """bridge 0.6.0, 0.5.0, 0.4.1 and 0.4.0 as run on the device: the bugs whose upstream file is the same in that
    release explain every recorded finding; what stays FAIL had more findings than recorded, or (0.4.0's Gemma 3 VL) a
    convcheck false alarm since fixed (the head rule read the older releases' wrapped SigLIP tower as headless). The
    rows re-run with this checkout (`--resume` of the device table and the re-runs, then `--retag`), the pins' and
    0.5.1's too: no untagged row and no row not covered is left on any of them (Ernie 4.5 VL, Qwen2.5-Omni and
    Qwen3-Omni re-run after convcheck's fixes: the probe's class state and EP override, the tied embedding in a
    wrapper's fp32 forward, the fields the shrink names; 0.5.1's Gemma 3 VL and Qwen3.5-MoE rows, whose runs recorded
    too few findings)."""
    cases = {
        ("h100-cpu-support-bridge-0.6.0-2026-12-07.json", "0.6.0"): (
            {"rows": 43, "pass": 16, "pass_generic": 22, "known_fail": 21, "not_covered": 3, "untagged_fail": 3,
             "outside": 15},
            {"Exaone4ForCausalLM", "Gemma3ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"},
        ),
        ("h100-cpu-support-bridge-0.5.0-2026-12-07.json", "0.5.0"): (
            {"rows": 38, "pass": 10, "pass_generic": 16, "known_fail": 22, "not_covered": 2, "untagged_fail": 4,
             "outside": 14},
            {"Gemma3ForConditionalGeneration", "Qwen2_5OmniForConditionalGeneration", "Qwen3_5MoeForCausalLM",
             "Qwen3_5MoeForConditionalGeneration"},
        ),
        ("h100-cpu-support-bridge-0.4.0-2026-12-07.json", "0.4.0"): (
            {"rows": 27, "pass": 8, "pass_generic": 11, "known_fail": 13, "not_covered": 0, "untagged_fail": 6,
             "outside": 7},
            {"Gemma3ForConditionalGeneration", "NemotronHForCausalLM", "Qwen2_5OmniForConditionalGeneration",
             "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
             "Qwen3VLMoeForConditionalGeneration"},
        ),
        ("h100-cpu-support-bridge-0.4.1-2026-12-07.json", "0.4.1"): (
            {"rows": 27, "pass": 8, "pass_generic": 11, "known_fail": 15, "not_covered": 0, "untagged_fail": 4,
             "outside": 7},
            {"Qwen2_5OmniForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
             "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"},
        ),
        ("cpu-support-bridge-0.4.1-rerun-2026-12-07.json", "0.4.1"): (
            {"rows": 27, "pass": 8, "pass_generic": 11, "known_fail": 19, "not_covered": 0, "untagged_fail": 0,
             "outside": 7},
            set(),
        ),
        ("cpu-support-bridge-0.6.2-rerun-2026-12-07.json", "0.6.2"): (
            {"rows": 43, "pass": 15, "pass_generic": 23, "known_fail": 28, "not_covered": 0, "untagged_fail": 0,
             "outside": 15},
            set(),
        ),
        ("cpu-support-bridge-0.6.0-rerun-2026-12-07.json", "0.6.0"): (
            {"rows": 43, "pass": 16, "pass_generic": 23, "known_fail": 27, "not_covered": 0, "untagged_fail": 0,
             "outside": 15},
            set(),
        ),
        ("cpu-support-bridge-0.5.0-rerun-2026-12-07.json", "0.5.0"): (
            {"rows": 38, "pass": 10, "pass_generic": 16, "known_fail": 28, "not_covered": 0, "untagged_fail": 0,
             "outside": 14},
            set(),
        ),
        ("cpu-support-bridge-0.4.0-rerun-2026-12-07.json", "0.4.0"): (
            {"rows": 27, "pass": 8, "pass_generic": 11, "known_fail": 19, "not_covered": 0, "untagged_fail": 0,
             "outside": 7},
            set(),
        ),
        ("cpu-support-bridge-0.4.2-rerun-2026-12-07.json", "0.4.2"): (
            {"rows": 27, "pass": 8, "pass_generic": 11, "known_fail": 19, "not_covered": 0, "untagged_fail": 0,
             "outside": 7},
            set(),
        ),
        ("cpu-support-bridge-0.5.1-rerun-2026-12-08.json", "0.5.1"): (
            {"rows": 38, "pass": 10, "pass_generic": 16, "known_fail": 28, "not_covered": 0, "untagged_fail": 0,
             "outside": 14},
            set(),
        ),
    }  # fmt: skip
    for (name, release), (counts, failing) in cases.items():
        rows = {r.arch: r for r in retag(workflow.load_rows(RESULTS / name), release)}
        assert workflow.counts(list(rows.values())) == counts, name
        assert {a for a, r in rows.items() if r.status == workflow.FAIL} == failing, name
    pins = {r.arch: r for r in workflow.load_rows(RESULTS / "cpu-support-bridge-0.6.2-rerun-2026-12-07.json")}
    assert pins["Ernie4_5_VLMoeForConditionalGeneration"].bugs == ["ernie45-vl-router-gates-bf16"]
    assert pins["Qwen3OmniMoeForConditionalGeneration"].verdicts["logits"] == "pass"
    rerun = {r.arch: r for r in workflow.load_rows(RESULTS / "cpu-support-bridge-0.4.2-rerun-2026-12-07.json")}
    assert rerun["MiniMaxM2ForCausalLM"].status == workflow.PASS
    assert rerun["Qwen2AudioForConditionalGeneration"].bugs == [
        "qwen2-audio-learned-position-embeddings", "qwen2-audio-dtype-from-text-config"]  # fmt: skip
    assert rerun["NemotronHForCausalLM"].bugs == [
        "export-raises-on-a-tensor-the-checkpoint-lacks", "transformers-nemotron-h-embedding-saved-singular",
        "nemotronh-mtp-pattern-export-raises", "nemotronh-mtp-pattern-without-mtp-layers"]  # fmt: skip
