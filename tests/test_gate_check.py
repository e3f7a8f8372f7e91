"""The gate's comparison, allow file, manifest format and CLI bad input: planted differences, no ranks."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from convcheck.errors import BadInput
from convcheck.gate.allow import load_allow, triage
from convcheck.gate.case import Case, default_matrix, select
from convcheck.gate.check import KINDS, compare, renamed
from convcheck.gate.manifest import build_manifest, dumps, load_manifest
from convcheck.layout import ParallelLayout
from tests.support.helpers import ROOT

SHA = {c: c * 64 for c in "abcdef"}


def manifest(**changes: Any) -> dict[str, Any]:
    """A small manifest as rank 0 builds it (two tensors, two tasks, three config fields, two oracles)."""
    entry = {"dtype": "bfloat16", "shape": [4, 2]}
    source = {"w.a": {**entry, "sha256": SHA["a"]}, "w.b": {**entry, "sha256": SHA["b"]}}
    m = build_manifest(
        case=Case(model="tiny:qwen3", layout=ParallelLayout(tp=2)).to_dict(),
        run={"versions": {"megatron-bridge": "0.6.2"}, "device": "cpu", "hooks": []},
        source=source,
        exported=copy.deepcopy(source),
        export_error=None,
        tasks={
            "p.a": {"mapping": "AutoMapping", "hf": "w.a", "resolved": "column"},
            "p.b": {"mapping": "QKVMapping", "hf": {"q": "w.b"}},
        },
        config={"vocab_size": 152, "rope_theta": 10000.0, "tie_word_embeddings": False},
        verdicts=[
            {"name": "coverage", "verdict": "pass", "checked": 4, "unit": "names", "findings": []},
            {"name": "roundtrip", "verdict": "pass", "checked": 2, "unit": "tensors", "findings": []},
        ],
    )
    return json.loads(json.dumps(m))  # as read back from the file


def kinds(diffs: list[Any]) -> list[tuple[str, str]]:
    return [(d.kind, d.subject) for d in diffs]


def test_identical_manifests_have_no_difference() -> None:
    assert compare(manifest(), manifest()) == []


def test_renamed_tensor_is_named_once_with_its_new_name() -> None:
    now = manifest()
    now["export"]["tensors"]["w.renamed"] = now["export"]["tensors"].pop("w.a")
    diffs = compare(manifest(), now)
    assert kinds(diffs) == [("tensor-renamed", "w.a")]
    assert "renamed to w.renamed" in diffs[0].message and diffs[0].case == "qwen3/tp2"


def test_renames_pair_in_name_order_by_bytes_in_linear_time() -> None:
    entry = {"dtype": "bfloat16", "shape": [2, 2]}
    old = {f"a.{i:05d}": {**entry, "sha256": f"h{i % 3}"} for i in range(20000)}
    new = {f"b.{i:05d}": {**entry, "sha256": f"h{i % 3}"} for i in range(19999)}
    new["b.extra"] = {**entry, "sha256": "other"}
    twins = renamed(sorted(old), sorted(new), old, new)
    assert len(twins) == 19999 and "a.19999" not in twins and "b.extra" not in twins.values()
    assert twins["a.00000"] == "b.00000" and twins["a.00004"] == "b.00004"  # first unpaired twin, in name order
    assert all(old[a]["sha256"] == new[b]["sha256"] for a, b in twins.items())


def test_changed_bytes_name_the_tensor_and_the_oracle_finding_that_explains_them() -> None:
    now = manifest()
    now["export"]["tensors"]["w.b"].update(sha256=SHA["c"], equals_source=False)
    now["oracles"]["roundtrip"].update(verdict="fail", findings=[
        {
            "kind": "bytes-differ",
            "tensor": "w.b",
            "message": "8/8 elements differ; first at index [0, 0]; diagnosis: transpose",
        }
    ])  # fmt: skip
    diffs = compare(manifest(), now)
    assert kinds(diffs) == [("bytes-changed", "w.b"), ("verdict-regression", "roundtrip")]
    assert "bytes changed: sha256 bbbbbbbbbbbb -> cccccccccccc" in diffs[0].message
    assert "first at index [0, 0]; diagnosis: transpose" in diffs[0].message
    assert "w.b [bytes-differ]" in diffs[1].message


def test_bytes_change_without_oracle_finding_says_how_it_relates_to_the_source() -> None:
    golden = manifest()
    golden["export"]["tensors"]["w.a"].update(sha256=SHA["d"], equals_source=False)
    diffs = compare(golden, manifest())
    assert kinds(diffs) == [("bytes-changed", "w.a")]
    assert "now equal to the source tensor" in diffs[0].message


def test_shape_dtype_added_removed_and_copies() -> None:
    now = manifest()
    now["export"]["tensors"]["w.a"]["shape"] = [8, 2]
    now["export"]["tensors"]["w.b"]["dtype"] = "float32"
    now["export"]["tensors"]["w.b"]["copies"] = 2
    now["export"]["tensors"]["w.new"] = {"dtype": "bfloat16", "shape": [1], "sha256": SHA["e"]}
    golden = manifest()
    golden["export"]["tensors"]["w.gone"] = {"dtype": "bfloat16", "shape": [3], "sha256": SHA["f"]}
    assert kinds(compare(golden, now)) == [
        ("tensor-removed", "w.gone"),
        ("tensor-added", "w.new"),
        ("shape-changed", "w.a"),
        ("tensor-copies", "w.b"),
        ("dtype-changed", "w.b"),
    ]


def test_changed_mapping_class_and_hf_names() -> None:
    now = manifest()
    now["tasks"]["p.a"]["resolved"] = "row"
    now["tasks"]["p.b"] = {"mapping": "ConcatenatedQKVMapping", "hf": {"q": "w.b2"}}
    now["tasks"]["p.c"] = {"mapping": "AutoMapping", "hf": "w.c"}
    diffs = compare(manifest(), now)
    assert kinds(diffs) == [
        ("mapping-changed", "p.a"),
        ("mapping-changed", "p.b"),
        ("hf-names-changed", "p.b"),
        ("task-added", "p.c"),
    ]
    assert diffs[0].message == "mapping AutoMapping (column) -> AutoMapping (row)"
    assert "QKVMapping -> ConcatenatedQKVMapping" in diffs[1].message


def test_changed_config_fields_including_type_and_absence() -> None:
    now = manifest()
    now["config"]["rope_theta"] = 1000000.0
    now["config"]["vocab_size"] = 152.0  # same number, other JSON type
    del now["config"]["tie_word_embeddings"]
    now["config"]["dtype"] = "bfloat16"
    diffs = compare(manifest(), now)
    assert kinds(diffs) == [
        ("config-changed", "dtype"),
        ("config-changed", "rope_theta"),
        ("config-changed", "tie_word_embeddings"),
        ("config-changed", "vocab_size"),
    ]
    assert diffs[0].message == "exported config dtype: absent -> 'bfloat16'"
    assert diffs[1].message == "exported config rope_theta: 10000.0 -> 1000000.0"


def test_verdicts_regression_improvement_findings_and_counts() -> None:
    golden = manifest()
    golden["oracles"]["roundtrip"].update(
        verdict="fail", findings=[{"kind": "missing", "tensor": "w.a", "message": "m"}]
    )
    golden["oracles"]["config"] = {"verdict": "pass", "checked": 9, "unit": "fields", "findings": []}
    now = manifest()
    now["oracles"]["coverage"].update(
        verdict="fail", checked=5, findings=[{"kind": "claimed-twice", "tensor": "p.a", "message": "m"}]
    )
    now["oracles"]["layout"] = {"verdict": "pass", "checked": 2, "unit": "tensors", "findings": []}
    assert kinds(compare(golden, now)) == [
        ("oracle-missing", "config"),
        ("verdict-regression", "coverage"),
        ("checked-changed", "coverage"),
        ("oracle-added", "layout"),
        ("verdict-improved", "roundtrip"),
    ]
    now["oracles"]["roundtrip"] = copy.deepcopy(golden["oracles"]["roundtrip"])
    now["oracles"]["roundtrip"]["findings"] = [{"kind": "missing", "tensor": "w.b", "message": "m"}]
    changed = [d for d in compare(golden, now) if d.subject == "roundtrip"]
    assert kinds(changed) == [("findings-changed", "roundtrip")]
    assert changed[0].detail == {"new": [["missing", "w.b"]], "gone": [["missing", "w.a"]]}


def test_changed_source_is_its_own_difference() -> None:
    now = manifest()
    now["source"]["sha256"] = SHA["f"]
    assert kinds(compare(manifest(), now)) == [("source-changed", "<source>")]


def test_every_reported_kind_is_documented() -> None:
    assert {"tensor-renamed", "bytes-changed", "mapping-changed", "config-changed", "verdict-regression"} <= set(KINDS)
    assert {"case-not-run", "case-not-golden"} <= set(KINDS)


def allow_file(tmp_path: Path, entries: list[dict[str, str]], suffix: str = ".json") -> Path:
    path = tmp_path / f"allow{suffix}"
    if suffix == ".toml":
        path.write_text("".join("[[allow]]\n" + "".join(f'{k} = "{v}"\n' for k, v in e.items()) for e in entries))
    else:
        path.write_text(json.dumps({"allow": entries}))
    return path


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_allow_entry_suppresses_one_difference_and_an_unused_entry_is_reported(tmp_path: Path, suffix: str) -> None:
    now = manifest()
    now["config"]["rope_theta"] = 1.0
    now["tasks"]["p.a"]["mapping"] = "ColumnParallelMapping"
    entries = load_allow(allow_file(tmp_path, [
        {"kind": "config-changed", "subject": "rope_*", "reason": "the new release exports rope in rope_parameters"},
        {"kind": "tensor-renamed", "case": "qwen3/*", "reason": "stale: renamed tensors were fixed upstream"},
        {"kind": "bytes-changed", "case": "llama/*", "reason": "another case, not run here"},
    ], suffix))  # fmt: skip
    result = triage(compare(manifest(), now), entries, ["qwen3/tp2"])
    assert kinds(list(result.failing)) == [("mapping-changed", "p.a")]
    assert [(d.subject, e.index) for d, e in result.allowed] == [("rope_theta", 1)]
    assert [e.index for e in result.unused] == [2]  # entry 3 names a case that did not run


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ('{"allow": [{"kind": "bytes-changed"}]}', ".json", "needs a reason"),
        ('{"allow": [{"kind": "bytes-moved", "reason": "r"}]}', ".json", "kind 'bytes-moved' is not one of"),
        ('{"allow": [{"kind": "bytes-changed", "reason": "r", "tensor": "x"}]}', ".json", "unknown key 'tensor'"),
        ('{"allowed": []}', ".json", "needs a list named 'allow'"),
        ("[[allow]\nkind=", ".toml", "is not valid TOML"),
        ("{", ".json", "is not valid JSON"),
    ],
)
def test_malformed_allow_file_is_bad_input(tmp_path: Path, text: str, suffix: str, message: str) -> None:
    path = tmp_path / f"allow{suffix}"
    path.write_text(text)
    with pytest.raises(BadInput, match=message):
        load_allow(path)


def test_manifest_text_is_readable_and_reads_back(tmp_path: Path) -> None:
    m = manifest()
    text = dumps(m)
    assert '      "w.a": {"dtype": "bfloat16", "shape": [4, 2], "sha256": "' in text  # one line per tensor
    (tmp_path / "m.json").write_text(text)
    assert load_manifest(tmp_path / "m.json") == m
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    with pytest.raises(BadInput, match="not a gate manifest"):
        load_manifest(tmp_path / "other.json")


def test_case_ids_and_selection() -> None:
    cases = default_matrix()
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    assert {"qwen3/tp1", "qwen3-moe/tp2ep2", "nemotron-h/ep2", "qwen2/tp4", "qwen3/tp2+pad128"} <= set(ids)
    assert "nemotron-h/pp2" not in ids and "qwen3/ep2" not in ids  # illegal layouts are not in the matrix
    assert [c.id for c in select(cases, models=("qwen3",), layouts=("TP2",))] == ["qwen3/tp2"]
    assert [c.id for c in select(cases, layouts=("tp2+pad128",))] == ["qwen3/tp2+pad128"]
    assert len(select(cases, models=("tiny:qwen3",))) == 5  # tp1, tp2, pp2, the padded tp2 and tp2 in the TE layout
    assert [c.id for c in select(cases, layouts=("tp2+te",))] == [
        "qwen3/tp2+te", "gemma3/tp2+te", "glm5/tp2+te", "qwen3-vl/tp2+te", "gemma4/tp2+te",
        "gemma4-vl/tp2+te", "nemotron-3-mtp/tp2+te", "gemma3-vl/tp2+te"]  # fmt: skip
    with pytest.raises(BadInput, match="unknown gate case 'qwen3/tp9'"):
        select(cases, ids=("qwen3/tp9",))
    assert Case.from_dict(cases[-1].to_dict()) == cases[-1]


def run_gate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "convcheck", "gate", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=False)  # fmt: skip


def test_gate_check_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    for args, message in (
        ((str(tmp_path),), "has no index.json"),
        ((str(tmp_path / "nowhere"),), "gate folder not found"),
        (("--case", "qwen3/tp9"), "unknown gate case 'qwen3/tp9'"),
        (("--allow", str(allow_file(tmp_path, [{"kind": "x", "reason": "r"}]))), "kind 'x' is not one of"),
    ):
        res = run_gate("check", *args)
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and message in res.stderr and "Traceback" not in res.stderr


def test_gate_check_names_a_case_that_no_longer_runs(tmp_path: Path) -> None:
    """A golden case whose checkpoint is gone: exit 1, the case named, JSON and JUnit written, a replay line."""
    gone = Case(model=str(tmp_path / "deleted-checkpoint"), layout=ParallelLayout())
    golden = tmp_path / "golden"
    golden.mkdir()
    (golden / "index.json").write_text(json.dumps({"format": "convcheck-gate-index/1", "cases": [
        {**gone.to_dict(), "file": gone.file_name}]}))  # fmt: skip
    out = tmp_path / "gate.json"
    res = run_gate("check", str(golden), "--json", str(out), "--junit", str(tmp_path / "junit.xml"))
    assert res.returncode == 1, res.stderr
    assert "<case>: [case-not-run] the case no longer runs: " in res.stdout
    assert f"replay: convcheck gate check {golden} --case deleted-checkpoint/tp1" in res.stdout
    result = json.loads(out.read_text())
    assert result["verdict"] == "fail" and result["cases"][0]["status"] == "not-run"
    assert 'name="deleted-checkpoint/tp1"' in (tmp_path / "junit.xml").read_text()
    reviewed = allow_file(tmp_path, [{"kind": "case-not-run", "case": "deleted-*", "reason": "checkpoint retired"}])
    res = run_gate("check", str(golden), "--allow", str(reviewed))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ALLOWED <case>: [case-not-run]" in res.stdout
    assert "PASS deleted-checkpoint/tp1: 0 difference(s), 1 allowed" in res.stdout


def test_golden_manifests_cover_the_default_matrix_on_the_current_pins() -> None:
    from convcheck.gate import GOLDEN_DIR
    from convcheck.workflows.gate_runner import read_index

    index = read_index(GOLDEN_DIR)
    assert sorted(index) == sorted(c.id for c in default_matrix())
    for case in index.values():
        path = GOLDEN_DIR / case.file_name
        m = load_manifest(path)
        assert m["case"]["id"] == case.id
        assert m["run"]["versions"]["megatron-bridge"] == "0.6.2" and m["run"]["versions"]["megatron-core"] == "0.19.2"
        assert m["run"]["hooks"] == [] and m["export"]["error"] is None
        findings = sum(len(v.get("findings") or ()) for v in m["oracles"].values())
        entries = m["source"]["tensors"] + len(m["tasks"]) + findings  # small: a few hundred bytes per entry
        assert path.stat().st_size < 300 * entries, f"{path.name} is {path.stat().st_size} bytes for {entries} entries"
