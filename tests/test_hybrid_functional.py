"""NemotronH config table and logits through the real bridge: passes at TP1/TP2, planted Mamba config bugs named."""

from pathlib import Path

import pytest

from convcheck.models import TABLES
from convcheck.models.config_rules import Coverage
from convcheck.models.nemotron_h import NEMOTRON_H_TABLE as NEMOTRON_H
from convcheck.oracles.config import flatten, uncovered
from tests.support.helpers import matrix_run, mutant, run_cli


def test_nemotron_h_table_covers_every_fixture_field() -> None:
    import transformers

    from convcheck.fixtures.build import build_fixture

    config = transformers.AutoConfig.from_pretrained(build_fixture("tiny:nemotron-h"))
    source, defaults = flatten(config.to_dict()), flatten(type(config)().to_dict())
    assert TABLES["nemotron_h"] is NEMOTRON_H
    assert uncovered(source, defaults, Coverage(rules=NEMOTRON_H)) == []
    differing = {k for k in source if source[k] != defaults.get(k)}
    ruled = {f for r in NEMOTRON_H for f in r.hf}
    assert {"layers_block_type", "mamba_num_heads", "n_groups", "ssm_state_size", "expand"} <= differing & ruled


@pytest.mark.ranks
@pytest.mark.parametrize("layout", [(), ("--tp", "2")], ids=["TP1", "TP2"])
def test_config_and_logits_pass(shared_root: Path, layout: tuple[str, ...]) -> None:
    res, _ = matrix_run(shared_root, "nemotron-h", layout)  # the verify-matrix run of this case: every default oracle
    assert res.code == 0, res.out + res.err
    assert res.verdicts()["config"] == "pass" and res.verdicts()["logits"] == "pass"
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert oracles["config"]["metrics"]["rules"] == len(NEMOTRON_H) and oracles["config"]["metrics"]["roundtrip_rules"]
    metrics = oracles["logits"]["metrics"]
    assert metrics["max_abs_err"] <= metrics["abs_tol"] and metrics["max_rel_err"] <= metrics["rel_tol"]
    assert metrics["greedy_match"] == "32/32"


PLANTED = [
    ("halve_mamba_heads", "mamba_num_heads -> mamba_num_heads"),
    ("swap_pattern", "layers_block_type -> hybrid_layer_pattern"),
    ("gated_norm_eps", "layer_norm_epsilon -> model.decoder.layers.*.mixer.norm.eps"),
]


@pytest.mark.ranks
@pytest.mark.parametrize("plant,label", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_mamba_config_bug_is_named_by_field(tmp_path: Path, plant: str, label: str) -> None:
    res = run_cli("verify", "--oracle", "config,logits", "--model", "tiny:nemotron-h",
                  "--hook", mutant("hybrid", plant), tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out + res.err
    findings = {f["tensor"]: f for f in res.findings("config")}
    assert label in findings, sorted(findings)
    assert findings[label]["kind"] == "mismatch"
    assert {f["kind"] for f in res.findings("config")} <= {"mismatch", "roundtrip-mismatch"}
    assert res.verdicts()["logits"] == "fail", "the planted field must also change the logits"


@pytest.mark.ranks
def test_symmetric_in_proj_bug_passes_roundtrip_and_fails_logits(tmp_path: Path) -> None:
    """dt rows before B/C in import and export: bytes round-trip, the Mamba forward does not."""
    res = run_cli("verify", "--oracle", "roundtrip,config,logits", "--model", "tiny:nemotron-h", "--tp", "2",
                  "--hook", mutant("mamba", "dt_before_bc"), tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out + res.err
    assert res.verdicts() == {"roundtrip": "pass", "config": "pass", "logits": "fail"}
    assert "logits-differ" in {f["kind"] for f in res.findings("logits")}
