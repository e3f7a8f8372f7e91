"""`convcheck support --retag`: a recorded table re-tagged with today's known bugs. The committed tables of the gated
releases (bench/results/) are the evidence the bugs named after those runs explain what the runs saw."""

from __future__ import annotations

import json
from pathlib import Path

from convcheck.models import UPSTREAM_BUG, tag_upstream_bugs
from convcheck.verdict import Finding, OracleVerdict
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
    """bridge 0.6.0, 0.5.0, 0.4.1, 0.4.0 and 0.3.0 as run on the device: the bugs whose upstream file is the same in
    that release explain every recorded finding; what stays FAIL had more findings than recorded, or a convcheck false
    alarm since fixed (0.4.0's Gemma 3 VL: the head rule read the older releases' wrapped SigLIP tower as headless;
    0.3.0's Gemma 3 rows: the RoPE rules read transformers 5's rope_parameters only). The rows re-run with this
    checkout (`--resume` of the device table and the re-runs, then `--retag`), the pins' and 0.5.1's too: no untagged
    row is left on any of them but 0.3.1's GPT-OSS (its experts' differential and elements findings, not yet triaged),
    and no row not covered but 0.3.x's (GPT-OSS needs TE on 0.3.0; transformers 4.57 cannot build the tiny Qwen3-VL
    models from a config that spells rope_parameters). Ernie 4.5 VL, Qwen2.5-Omni and
    Qwen3-Omni were re-run after convcheck's fixes (the probe's class state and EP override, the tied embedding in a
    wrapper's fp32 forward, the fields the shrink names); 0.5.1's Gemma 3 VL and Qwen3.5-MoE rows because their runs
    recorded too few findings."""
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
        ("h100-cpu-support-bridge-0.3.0-2026-12-07.json", "0.3.0"): (
            {"rows": 21, "pass": 0, "pass_generic": 0, "known_fail": 14, "not_covered": 3, "untagged_fail": 4,
             "outside": 3},
            {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"},
        ),
        ("cpu-support-bridge-0.3.0-rerun-2026-12-08.json", "0.3.0"): (
            {"rows": 21, "pass": 0, "pass_generic": 0, "known_fail": 18, "not_covered": 3, "untagged_fail": 0,
             "outside": 3},
            set(),
        ),
        ("cpu-support-bridge-0.3.1-2026-12-08.json", "0.3.1"): (
            {"rows": 21, "pass": 0, "pass_generic": 0, "known_fail": 18, "not_covered": 2, "untagged_fail": 1,
             "outside": 3},
            {"GptOssForCausalLM"},
        ),
        ("cpu-support-bridge-0.3.1-rerun-2026-12-08.json", "0.3.1"): (
            {"rows": 21, "pass": 0, "pass_generic": 0, "known_fail": 18, "not_covered": 2, "untagged_fail": 1,
             "outside": 3},
            {"GptOssForCausalLM"},
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


def _verdict(oracle: str, *findings: tuple[str, str, str]) -> OracleVerdict:
    return OracleVerdict(name=oracle, checked=len(findings),
                         findings=tuple(Finding(tensor=t, kind=k, message=m) for t, k, m in findings))  # fmt: skip


def _tags(arch: str, release: str, *verdicts: OracleVerdict) -> list[list[str | None]]:
    tagged, _ = tag_upstream_bugs(arch, release, verdicts)
    return [[f.detail.get(UPSTREAM_BUG) for f in v.findings] for v in tagged]


def test_the_0_3_bugs_tag_their_own_release_and_findings_only() -> None:
    """The bugs named from the 0.3.x tables, on findings as those runs recorded them: the row-parallel scatter's
    consequences (the mapping oracle's shards, the first layout-dependent tensor, the logits) only beside its own
    roundtrip finding; Qwen3's ignored head_dim by its config mismatch or its own import error, Qwen3-VL's by its
    language model's import error (and its text-config dtype); the build failures by their own messages, on their own
    releases."""
    scatter = "row-parallel-scatter-non-contiguous"
    roundtrip = _verdict("roundtrip", ("model.layers.1.mlp.shared_experts.down_proj.weight", "bytes-differ", "2016"))
    mapping = _verdict("mapping", ("decoder.layers.0.self_attention.linear_proj.weight", "import-bytes-differ", "r0"),
                       ("decoder.layers.0.mlp.linear_fc2.weight", "import-bytes-differ", "r1"))  # fmt: skip
    layout = _verdict("layout", ("<layout>", "first-differing", "model.layers.0.mlp.down_proj.weight"))
    logits = _verdict("logits", ("logits", "logits-differ", "0.23"), ("greedy-tokens", "greedy-differs", "5/32"))
    for release in ("0.3.0", "0.3.1"):
        tags = _tags("LlamaForCausalLM", release, roundtrip, mapping, layout, logits)
        assert tags == [[scatter], [scatter] * 2, [scatter], [scatter] * 2], release
    assert _tags("LlamaForCausalLM", "0.3.0", mapping, layout, logits) == [[None] * 2, [None], [None] * 2]
    assert _tags("LlamaForCausalLM", "0.4.0", roundtrip, mapping)[1] == [None] * 2

    head_dim = "qwen3-head-dim-ignored"
    config = _verdict("config", ("head_dim -> kv_channels", "mismatch", "head_dim=16 requires kv_channels=16; 128"))
    crash = ("bridge.load_hf_weights raised ValueError: Shape mismatch for megatron param "
             "decoder.layers.0.self_attention.k_layernorm.weight: expected (128,)")  # fmt: skip
    coverage = _verdict("coverage", ("<import>", "import-failed", crash),
                        ("decoder.layers.0.self_attention.linear_proj.weight", "not-loaded", "kept"))  # fmt: skip
    qwen = _tags("Qwen3ForCausalLM", "0.3.0", config, coverage, logits)
    assert qwen == [[head_dim], [head_dim] * 2, [head_dim] * 2]
    assert _tags("Qwen3MoeForCausalLM", "0.3.0", coverage) == [[head_dim] * 2]
    other = _verdict("coverage", ("<import>", "import-failed", "bridge.load_hf_weights raised KeyError: 'x'"))
    assert _tags("Qwen3MoeForCausalLM", "0.3.0", other) == [[None]]
    assert _tags("Qwen3ForCausalLM", "0.3.1", config, coverage) == [[None], [None] * 2]
    vl_head_dim, vl_dtype = "qwen3-vl-head-dim-as-provider-field", "qwen3-vl-dtype-from-text-config"
    vl_crash = crash.replace("param decoder.", "param language_model.decoder.")
    vl_kept = "language_model.decoder.layers.0.self_attention.linear_proj.weight"
    vl = _verdict("coverage", ("<import>", "import-failed", vl_crash), (vl_kept, "not-loaded", "kept"))
    fp32 = _verdict("roundtrip", ("lm_head.weight", "dtype", "dtype float32, expected bfloat16"))
    vl_config = _verdict("config", ("text_config.head_dim -> kv_channels", "mismatch", "head_dim=16 requires 16"))
    for arch in ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"):
        assert _tags(arch, "0.3.0", vl, fp32) == [[vl_head_dim] * 2, [vl_dtype]], arch
        assert _tags(arch, "0.3.0", vl_config) == [[vl_head_dim]], arch
        assert _tags(arch, "0.3.1", vl, fp32, vl_config) == [[None] * 2, [None], [None]], arch
    assert _tags("Qwen3ForCausalLM", "0.3.0", vl) == [[None] * 2]

    def build(message: str) -> OracleVerdict:
        return _verdict(
            "coverage", ("<build>", "build-failed", f"the bridge's provider or model build raised {message}")
        )

    cases = (
        ("Glm4MoeForCausalLM", "AttributeError: 'Glm4MoeConfig' object has no attribute 'head_dim'",
         "glm45-head-dim-required", ("0.3.0",), ("0.3.1",)),
        ("Glm4vMoeForConditionalGeneration", "AttributeError: 'Glm4vMoeTextConfig' object has no attribute 'head_dim'",
         "glm45v-head-dim-required", ("0.3.0", "0.3.1"), ()),
        ("Mistral3ForConditionalGeneration",
         "AttributeError: 'MistralConfig' object has no attribute 'rope_parameters'",
         "ministral3-rope-parameters-required", ("0.3.0", "0.3.1"), ("0.4.0",)),
        ("DeepseekV3ForCausalLM", ("ValueError: Expert bias for aux-loss-free routing only supports sigmoid score "
         "function."), "deepseek-v3-score-function-unset", ("0.3.1",), ("0.3.0", "0.4.0")),
    )  # fmt: skip
    for arch, message, bug, seen, not_seen in cases:
        for release in seen:
            assert _tags(arch, release, build(message)) == [[bug]], (arch, release)
        for release in not_seen:
            assert _tags(arch, release, build(message)) == [[None]], (arch, release)
        assert _tags(arch, seen[0], build("RuntimeError: something else")) == [[None]], arch
    kv = _verdict("config", ("head_dim -> kv_channels", "mismatch", "head_dim=16 requires kv_channels=16; 4"))
    assert _tags("DeepseekV3ForCausalLM", "0.3.0", kv) == [["deepseek-kv-heads-as-kv-channels"]]
    assert _tags("DeepseekV3ForCausalLM", "0.3.1", kv) == [[None]]


def test_bridge_0_3_0_with_the_row_parallel_splits_made_contiguous_fails_only_on_its_other_bugs() -> None:
    """Bridge 0.3.0's site with scatter_to_tp_ranks' splits made contiguous (param_mapping.py:502, the 0.4.0 fix): the
    rows whose 0.3.0 table shows the scatter's consequences (logits, the first layout-dependent tensor, the mapping
    oracle's shards) pass, or fail only on their other named bugs."""
    rows = {r.arch: r for r in workflow.load_rows(RESULTS / "cpu-support-bridge-0.3.0-scatter-fixed-2026-12-08.json")}
    assert {a: (r.status, r.bugs) for a, r in rows.items()} == {
        "LlamaForCausalLM": (workflow.PASS, []),
        "DeepseekV2ForCausalLM": (workflow.PASS, []),
        "Gemma2ForCausalLM": (workflow.KNOWN_FAIL, ["te-post-layernorm-default-eps"]),
        "DeepseekV3ForCausalLM": (workflow.KNOWN_FAIL, ["deepseek-kv-heads-as-kv-channels"]),
    }
    assert all(r.verdicts[o] == "pass" for r in rows.values() for o in ("roundtrip", "layout", "differential"))
    assert rows["DeepseekV3ForCausalLM"].verdicts["logits"] == "pass"
    table = {r.arch: r for r in retag(workflow.load_rows(RESULTS / "cpu-support-bridge-0.3.0-rerun-2026-12-08.json"),
                                      "0.3.0")}  # fmt: skip
    for arch in rows:
        assert "row-parallel-scatter-non-contiguous" in table[arch].bugs, arch
