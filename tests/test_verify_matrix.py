"""`convcheck verify` passes for every fixture at every layout on CPU, one torchrun launch per case.

Each case also writes its gate manifest (`--manifest`) and must match the golden one shipped in
convcheck/gate/golden/ (the bridge-upgrade gate, checked without an extra launch).
"""

import math
from pathlib import Path

import pytest

from convcheck.fixtures.build import build_fixture
from convcheck.gate import GOLDEN_DIR
from convcheck.gate.case import default_matrix
from convcheck.gate.check import compare
from convcheck.gate.manifest import load_manifest
from convcheck.hf.checkpoint import open_checkpoint
from convcheck.oracles import DEFAULT_ORACLES
from tests.support.cases import CASES, PADDED, PASSING, gate_case
from tests.support.helpers import matrix_run, run_cli


def assert_matches_golden(name: str, layout: tuple[str, ...], manifest: Path) -> None:
    """The case's manifest has no difference from the golden one (the gate, run through its library)."""
    case = gate_case(name, layout)
    differences = compare(load_manifest(GOLDEN_DIR / case.file_name), load_manifest(manifest))
    assert differences == [], "\n".join(f"{d.subject}: [{d.kind}] {d.message}" for d in differences)


def test_matrix_covers_every_golden_case() -> None:
    assert sorted(gate_case(n, lay).id for n, lay in [*CASES, PADDED]) == sorted(c.id for c in default_matrix())


def default_oracles(layout: tuple[str, ...]) -> list[str]:
    """What a plain `verify` must run: every default oracle, whatever the expert layout."""
    return list(DEFAULT_ORACLES)


@pytest.mark.ranks
@pytest.mark.parametrize(("name", "layout"), PASSING, ids=[f"{n}-{'-'.join(lay) or 'tp1'}" for n, lay in PASSING])
def test_verify_passes(name: str, layout: tuple[str, ...], shared_root: Path) -> None:
    res, folder = matrix_run(shared_root, name, layout)  # other files' tests read this run's report too
    manifest = folder / "manifest.json"
    assert res.code == 0, res.out[-3000:] + res.err[-2000:]
    report = res.report
    assert report is not None
    assert report["verdict"] == "pass"
    assert report["model"] == f"tiny:{name}"
    assert set(report["versions"]) >= {"torch", "megatron-core", "megatron-bridge", "transformers"}
    assert report["versions"]["megatron-core"] == "0.19.2"
    assert {"coverage", "roundtrip"} <= {o["name"] for o in report["oracles"]}
    names = [o["name"] for o in report["oracles"]]
    assert sorted(names) == sorted(default_oracles(layout)), names  # the full default set, each exactly once
    for oracle in report["oracles"]:
        assert oracle["verdict"] == "pass" and oracle["checked"] > 0 and oracle["findings"] == []
    oracles = {o["name"]: o for o in report["oracles"]}
    assert oracles["roundtrip"]["checked"] == len(oracles["roundtrip"]["tensors"])
    numel = sum(math.prod(e.shape) for e in open_checkpoint(build_fixture(f"tiny:{name}")).tensors.values())
    for name_ in ("differential", "elements"):  # every element of every source tensor proven, per task
        if name_ in oracles:
            assert oracles[name_]["checked"] == numel and oracles[name_]["unit"] == "elements"
    if "layout" in oracles:
        assert oracles["layout"]["checked"] == oracles["roundtrip"]["checked"]
        # every tensor equals the source (roundtrip's drain told): no TP1 job, no drain of its own
        assert oracles["layout"]["metrics"] == {"reference": "source", "export": "roundtrip"}
    rows = oracles["mapping"]["tensors"]  # every Megatron parameter covered by an explicit mapping and proven
    assert rows and [r["tensor"] for r in rows if r["verdict"] != "pass"] == []
    assert "PASS" in res.out.strip().splitlines()[-1]
    assert_matches_golden(name, layout, manifest)


@pytest.mark.local_spec("its golden manifest was made in the local layout")
@pytest.mark.ranks
def test_padded_vocabulary_export_keeps_the_padding_rows(tmp_path: Path) -> None:
    """megatron-bridge 0.6.2 pads the vocabulary rows on import at TP2 but exports them: [256, 32] for a 152-token
    vocab. The oracles name it (and the TP1 reference, whose import raises); the rest passes."""
    name, layout = PADDED
    manifest = tmp_path / "manifest.json"
    res = run_cli("verify", "--model", f"tiny:{name}", *layout, "--manifest", str(manifest), tmp_path=tmp_path)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    verdicts = res.verdicts()
    assert {o for o, v in verdicts.items() if v == "pass"} == {"coverage", "config", "logits", "differential"}
    padded = {"lm_head.weight", "model.embed_tokens.weight"}
    assert {(f["tensor"], f["kind"]) for f in res.findings("roundtrip")} == {(t, "shape") for t in padded}
    assert all(
        "104 rows padded along dim 0 after the 152 source rows" in f["message"] for f in res.findings("roundtrip")
    )
    assert {(f["tensor"], f["kind"]) for f in res.findings("mapping")} == {(t, "export-shape") for t in padded}
    assert {f["tensor"] for f in res.findings("elements")} == padded
    assert "--pad-vocab 128" in res.out.strip().splitlines()[-1]  # the replay line
    assert_matches_golden(name, layout, manifest)


def test_shared_runs_are_keyed_by_case_id() -> None:
    from tests.support.cases import case_id

    assert case_id("qwen3-moe", ("--ep", "2", "--tp", "2")) == case_id("qwen3-moe", ("--tp", "2", "--ep", "2"))
    with pytest.raises(KeyError, match=r"no verify-matrix case qwen3/tp8"):
        case_id("qwen3", ("--tp", "8"))
