"""ETP layouts run every oracle; the layout oracle names the first differing tensor under planted bugs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from convcheck.api import resolve_model
from convcheck.hf.checkpoint import open_checkpoint
from tests.support.helpers import mutant, run_cli

ORACLES = "coverage,roundtrip,config,logits,differential,elements,layout,mapping"
MATRIX = [
    ("tiny:qwen3-moe", ("--tp", "2", "--etp", "2")),
    ("tiny:qwen3-moe", ("--ep", "2", "--etp", "2")),  # 4 gloo ranks
]
"""ETP layouts; TP1, TP2, EP2, TP2xEP2 and PP2 run every oracle in tests/test_verify_matrix.py."""


@pytest.mark.ranks
@pytest.mark.parametrize(
    ("model", "layout"), MATRIX, ids=[f"{m}-{'x'.join(lay[1::2]) or '1'}{''.join(lay[::2])}" for m, lay in MATRIX]
)
def test_layout_matrix(model: str, layout: tuple[str, ...], tmp_path: Path) -> None:
    r = run_cli("verify", "--model", model, *layout, "--oracle", ORACLES, tmp_path=tmp_path)
    assert r.report is not None, r.err
    assert r.verdicts() == dict.fromkeys(ORACLES.split(","), "pass"), r.findings()
    numel = sum(math.prod(e.shape) for e in open_checkpoint(resolve_model(model)).tensors.values())
    oracles = {o["name"]: o for o in r.report["oracles"]}
    assert oracles["elements"]["checked"] == numel and oracles["elements"]["unit"] == "elements"
    assert oracles["differential"]["checked"] == numel
    tasks = oracles["differential"]["tensors"]
    assert tasks and all(int(t["tensor"].rsplit("[", 1)[1].split()[0]) > 0 for t in tasks)
    assert oracles["layout"]["checked"] == oracles["roundtrip"]["checked"]


@pytest.mark.ranks
def test_layout_names_first_differing_tensor(tmp_path: Path) -> None:
    hook = mutant("collectives", "tp_concat_reversed")
    r = run_cli("verify", "--model", "tiny:qwen3", "--tp", "2", "--oracle", "layout", "--hook", hook, tmp_path=tmp_path)
    assert r.code == 1
    findings = r.findings("layout")
    first = next(f for f in findings if f["kind"] == "first-differing")
    assert first["detail"]["tensor"] == "model.embed_tokens.weight"
    emb = next(f for f in findings if f["tensor"] == "model.embed_tokens.weight")
    assert emb["detail"]["first_index"] == [0, 0] and "TP" in emb["detail"]["diagnosis"]
