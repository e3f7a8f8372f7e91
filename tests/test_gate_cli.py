"""One real `convcheck gate check` run against the shipped golden manifests, with a planted bug."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.helpers import mutant, run_cli


@pytest.mark.ranks
def test_gate_check_names_a_planted_bug_as_bytes_changed(tmp_path: Path) -> None:
    out = tmp_path / "gate.json"
    hook = mutant("bridge", "transpose_o_proj")
    res = run_cli("gate", "check", "--model", "tiny:qwen3", "--layout", "tp2", "--hook", hook, "--json", str(out),
                  timeout=900)  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    line = next(x for x in res.out.splitlines() if x.startswith("FAIL model.layers.0.self_attn.o_proj.weight"))
    assert "[bytes-changed] bytes changed: sha256 " in line
    assert "roundtrip now: [bytes-differ]" in line and "diagnosis: export is the source transposed" in line
    assert f"replay: convcheck gate check --case qwen3/tp2 --hook {hook}" in res.out
    result = json.loads(out.read_text())
    assert [c["id"] for c in result["cases"]] == ["qwen3/tp2"]
    kinds = {(d["kind"], d["subject"]) for d in result["cases"][0]["differences"]}
    assert ("bytes-changed", "model.layers.0.self_attn.o_proj.weight") in kinds
    assert ("verdict-regression", "roundtrip") in kinds
    assert not any(k == "bytes-changed" and s != "model.layers.0.self_attn.o_proj.weight" for k, s in kinds)
