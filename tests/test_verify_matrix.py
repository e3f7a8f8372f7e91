"""`convcheck verify` passes for every fixture at every layout on CPU, one torchrun launch per case.

Each case also writes its gate manifest (`--manifest`) and must match the golden one shipped in
convcheck/gate/golden/ (the bridge-upgrade gate, checked without an extra launch).
"""

import math
from pathlib import Path

import pytest

from convcheck.checkpoint import open_checkpoint
from convcheck.fixtures import FIXTURES, RELEASE_VARIANTS, build_fixture
from convcheck.gate import GOLDEN_DIR
from convcheck.gate.case import Case, default_matrix
from convcheck.gate.check import compare
from convcheck.gate.manifest import load_manifest
from convcheck.layout import ParallelLayout
from convcheck.oracles import DEFAULT_ORACLES
from tests.helpers import matrix_run, run_cli

DENSE_LAYOUTS = [(), ("--tp", "2"), ("--pp", "2")]
MOE_LAYOUTS = [("--ep", "2"), ("--tp", "2", "--ep", "2")]
HYBRID_LAYOUTS = [(), ("--tp", "2"), ("--ep", "2")]
DENSE = [name for name in sorted(FIXTURES) if name not in ("nemotron-h", *RELEASE_VARIANTS)]
CASES = (
    [(name, layout) for name in DENSE for layout in DENSE_LAYOUTS]
    + [("qwen3-moe", layout) for layout in MOE_LAYOUTS]
    + [("nemotron-h", layout) for layout in HYBRID_LAYOUTS]
    + [("qwen2", ("--tp", "4"))]  # fewer KV heads (2) than TP ranks (4): each query group split over two ranks
)
PADDED = ("qwen3", ("--tp", "2", "--pad-vocab", "128"))
"""The padded vocabulary training uses (make_vocab_size_divisible_by=128 x TP2): megatron-bridge 0.6.2 fails it."""


def gate_case(name: str, layout: tuple[str, ...]) -> Case:
    """The gate case of one matrix entry (its golden manifest is GOLDEN_DIR / case.file_name)."""
    args = dict(zip(layout[::2], layout[1::2], strict=True))
    pad = args.pop("--pad-vocab", None)
    grid = ParallelLayout(**{k.removeprefix("--"): int(v) for k, v in args.items()})
    return Case(model=f"tiny:{name}", layout=grid, pad_vocab=int(pad) if pad else None)


def assert_matches_golden(name: str, layout: tuple[str, ...], manifest: Path) -> None:
    """The case's manifest has no difference from the golden one (the gate, run through its library)."""
    case = gate_case(name, layout)
    differences = compare(load_manifest(GOLDEN_DIR / case.file_name), load_manifest(manifest))
    assert differences == [], "\n".join(f"{d.subject}: [{d.kind}] {d.message}" for d in differences)


def test_matrix_covers_every_golden_case() -> None:
    assert sorted(gate_case(n, lay).id for n, lay in [*CASES, PADDED]) == sorted(c.id for c in default_matrix())


def default_oracles(layout: tuple[str, ...]) -> list[str]:
    """What a plain `verify` must run: every default oracle, less logits for te-grouped experts (no forward)."""
    names = list(DEFAULT_ORACLES)
    te_grouped = "--experts" in layout and layout[layout.index("--experts") + 1] == "te-grouped"
    return [name for name in names if not (te_grouped and name == "logits")]


@pytest.mark.ranks
@pytest.mark.parametrize(("name", "layout"), CASES, ids=[f"{n}-{'-'.join(lay) or 'tp1'}" for n, lay in CASES])
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
    rows = oracles["mapping"]["tensors"]  # every Megatron parameter covered by an explicit mapping and proven
    assert rows and [r["tensor"] for r in rows if r["verdict"] != "pass"] == []
    assert "PASS" in res.out.strip().splitlines()[-1]
    assert_matches_golden(name, layout, manifest)


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
