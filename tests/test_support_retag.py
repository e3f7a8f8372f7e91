"""`convcheck support --retag`: a recorded table re-tagged with today's known bugs. The committed tables of bridge
0.5.1 and 0.4.2 (bench/results/) are the evidence the bugs named after those runs explain what the runs saw."""

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


def test_the_0_6_0_table_and_the_0_4_2_rerun_retag_to_their_named_bugs() -> None:
    """bridge 0.6.0 (32 of its 43 rows, the device run cut at its time limit): the pins' bugs whose upstream file is
    the same in 0.6.0 explain every recorded finding; what stays FAIL had more findings than recorded. The 0.4.2 rows
    re-run after convcheck's fixes: MiniMax-M2 passes, Qwen2-Audio fails only on its two 0.4.x bugs; NemotronH's export
    error and Qwen2.5-Omni's unloadable HF reference (spk_dict.pt) are not yet named."""
    cases = {
        ("h100-cpu-support-bridge-0.6.0-partial-2026-12-07.json", "0.6.0"): (
            {"rows": 32, "pass": 15, "pass_generic": 15, "known_fail": 13, "not_covered": 2, "untagged_fail": 2,
             "outside": 15},
            {"Exaone4ForCausalLM", "Gemma3ForConditionalGeneration"},
        ),
        ("cpu-support-bridge-0.4.2-rerun-2026-12-07.json", "0.4.2"): (
            {"rows": 27, "pass": 8, "pass_generic": 11, "known_fail": 17, "not_covered": 0, "untagged_fail": 2,
             "outside": 7},
            {"NemotronHForCausalLM", "Qwen2_5OmniForConditionalGeneration"},
        ),
    }  # fmt: skip
    for (name, release), (counts, failing) in cases.items():
        rows = {r.arch: r for r in retag(workflow.load_rows(RESULTS / name), release)}
        assert workflow.counts(list(rows.values())) == counts, name
        assert {a for a, r in rows.items() if r.status == workflow.FAIL} == failing, name
    rerun = {r.arch: r for r in workflow.load_rows(RESULTS / "cpu-support-bridge-0.4.2-rerun-2026-12-07.json")}
    assert rerun["MiniMaxM2ForCausalLM"].status == workflow.PASS
    assert rerun["Qwen2AudioForConditionalGeneration"].bugs == [
        "qwen2-audio-learned-position-embeddings", "qwen2-audio-dtype-from-text-config"]  # fmt: skip
