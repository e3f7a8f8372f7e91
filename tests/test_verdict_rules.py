"""The verdict rules, without ranks: a report is complete or it fails, and it survives its JSON form unchanged."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from convcheck.cli.render import junit_xml, report_json
from convcheck.testing import assert_verdict_pass
from convcheck.verdict import (
    FAIL,
    NOT_COVERED,
    PASS,
    Finding,
    OracleVerdict,
    Report,
    TensorRow,
    complete,
    make_verdict,
)

FINDING = Finding(
    tensor="model.norm.weight",
    kind="bytes-differ",
    message="1/32 elements differ; first at index [3]: got nan (0x7fc1), expected -0.0 (0x8000)",
    detail={"index": [3], "expected_bits": "0x8000", "actual_bits": "0x7fc1", "rank": 1},
)
ROW = TensorRow(tensor="model.norm.weight", shape=(32,), dtype="bfloat16", verdict="fail")


def _report(*oracles: OracleVerdict) -> Report:
    return Report(model="tiny:qwen3", layout={"tp": 2, "pp": 1, "ep": 1, "etp": 1}, device="cpu", versions={},
                  oracles=oracles)  # fmt: skip


def test_an_oracle_that_checked_nothing_fails() -> None:
    empty = OracleVerdict(name="roundtrip", checked=0)
    assert empty.verdict == FAIL
    assert empty.to_dict()["verdict"] == FAIL
    assert _report(empty, OracleVerdict(name="coverage", checked=44)).verdict == FAIL


def test_findings_make_an_oracle_fail_and_a_clean_check_passes() -> None:
    assert OracleVerdict(name="roundtrip", checked=25).verdict == PASS
    failing = make_verdict("roundtrip", checked=25, findings=[FINDING])
    assert failing.verdict == FAIL
    assert _report(OracleVerdict(name="coverage", checked=44), failing).verdict == FAIL
    clean = OracleVerdict(name="roundtrip", checked=25)
    assert _report(OracleVerdict(name="coverage", checked=44), clean).verdict == PASS


UNCOVERED = OracleVerdict(name="mapping", checked=0, not_covered="convcheck has no explicit mappings for XForCausalLM")


def test_not_covered_is_neither_a_pass_nor_a_fail_and_findings_still_fail() -> None:
    """A family convcheck lacks (issue #34): the report says so unless something failed."""
    assert UNCOVERED.verdict == NOT_COVERED and UNCOVERED.to_dict()["not_covered"].startswith("convcheck has no")
    clean = OracleVerdict(name="roundtrip", checked=25)
    assert _report(clean, UNCOVERED).verdict == NOT_COVERED
    assert _report(make_verdict("roundtrip", checked=25, findings=[FINDING]), UNCOVERED).verdict == FAIL
    flagged = OracleVerdict(name="mapping", checked=3, findings=(FINDING,), not_covered="partly")
    assert flagged.verdict == FAIL  # a finding is never hidden behind "not covered"
    assert OracleVerdict.from_dict(json.loads(json.dumps(UNCOVERED.to_dict()))) == UNCOVERED
    xml = ET.fromstring(junit_xml(_report(clean, UNCOVERED)))
    assert (xml.get("failures"), xml.get("skipped")) == ("0", "1")
    assert xml.find("testcase[@name='mapping']/skipped").get("message") == f"not covered: {UNCOVERED.not_covered}"
    with pytest.raises(AssertionError) as caught:
        assert_verdict_pass(_report(clean, UNCOVERED))
    assert str(caught.value) == (
        "convcheck verify tiny:qwen3 at TP2: NOT COVERED (1 of 2 oracles cannot check this model family; nothing "
        "failed)\n  mapping: not covered: convcheck has no explicit mappings for XForCausalLM"
    )


def test_a_report_without_oracles_fails() -> None:
    assert _report().verdict == FAIL


def test_a_requested_oracle_without_a_verdict_fails_naming_it() -> None:
    got = complete(("coverage", "roundtrip", "mapping"), (OracleVerdict(name="coverage", checked=44),))
    assert [v.name for v in got] == ["coverage", "roundtrip", "mapping"]
    by_name = {v.name: v for v in got}
    assert by_name["coverage"].verdict == PASS
    for name in ("roundtrip", "mapping"):
        missing = by_name[name]
        assert missing.verdict == FAIL and missing.checked == 0
        assert [f.kind for f in missing.findings] == ["no-verdict"]
        assert f"oracle {name} was requested but returned no verdict" in missing.findings[0].message
    assert _report(*got).verdict == FAIL


def test_complete_keeps_request_order_and_unrequested_verdicts() -> None:
    verdicts = (OracleVerdict(name="roundtrip", checked=1), OracleVerdict(name="extra", checked=1),
                OracleVerdict(name="coverage", checked=1))  # fmt: skip
    got = complete(("coverage", "roundtrip"), verdicts)
    assert [v.name for v in got] == ["coverage", "roundtrip", "extra"]
    assert all(v.verdict == PASS for v in got)


@pytest.mark.parametrize(
    "verdict",
    [
        OracleVerdict(name="coverage", checked=44, unit="names (25 HF + 19 Megatron)", rows=(ROW,), seconds=0.25),
        make_verdict("roundtrip", checked=25, findings=[FINDING], rows=(ROW,), seconds=1.5),
        OracleVerdict(name="logits", checked=64, unit="logits", metrics={"max_abs": 3e-8, "greedy": [32, 32]}),
        OracleVerdict(name="mapping", checked=0),
    ],
    ids=["pass", "findings", "metrics", "checked-nothing"],
)
def test_a_verdict_survives_its_json_form(verdict: OracleVerdict) -> None:
    data = json.loads(json.dumps(verdict.to_dict()))
    assert data["verdict"] == verdict.verdict
    back = OracleVerdict.from_dict(data)
    assert back == verdict
    assert back.verdict == verdict.verdict


def test_the_verdict_is_recomputed_from_the_json_not_trusted() -> None:
    data = make_verdict("roundtrip", checked=25, findings=[FINDING]).to_dict()
    data["verdict"] = PASS  # a hand-edited report cannot turn findings into a pass
    assert OracleVerdict.from_dict(data).verdict == FAIL
    data = OracleVerdict(name="roundtrip", checked=0).to_dict()
    data["verdict"] = PASS
    assert OracleVerdict.from_dict(data).verdict == FAIL


def test_a_report_survives_json_and_junit_with_its_missing_oracle() -> None:
    oracles = complete(("coverage", "roundtrip"), (make_verdict("coverage", checked=44, findings=[FINDING]),))
    report = _report(*oracles)
    data = json.loads(report_json(report))
    assert data["verdict"] == FAIL
    assert tuple(OracleVerdict.from_dict(o) for o in data["oracles"]) == oracles
    assert [(o["name"], o["verdict"]) for o in data["oracles"]] == [("coverage", FAIL), ("roundtrip", FAIL)]
    suite = ET.fromstring(junit_xml(report))
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert set(cases) == {"coverage", "roundtrip"}
    assert all(case.find("failure") is not None for case in cases.values())
    assert "no-verdict" in ET.tostring(cases["roundtrip"], encoding="unicode")
