"""`verify --experts te-grouped`: the bridge's TEGroupedMLP mappings (`experts.linear_fcN.weightE`) on CPU."""

from pathlib import Path

import pytest

from tests.support.helpers import mutant, run_cli

CORE = "coverage,roundtrip,differential,elements,mapping"


def _grouped_rows(res, oracle: str) -> list[str]:  # type: ignore[no-untyped-def]
    rows = next(o["tensors"] for o in res.report["oracles"] if o["name"] == oracle)
    return [r["tensor"] for r in rows if ".experts.linear_fc" in r["tensor"]]


@pytest.mark.ranks
def test_tp2_ep2_default_oracles_pass_logits_included(tmp_path: Path) -> None:
    """Every default oracle, logits too: the stand-in's forward is the replaced SequentialMLP's on the grouped
    weights the bridge loaded."""
    res = run_cli("verify", "--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "2", "--experts", "te-grouped",
                  "--table", "none", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 0, res.out + res.err
    verdicts = res.verdicts()
    assert {*CORE.split(","), "logits"} <= set(verdicts) and set(verdicts.values()) == {"pass"}
    names = _grouped_rows(res, "mapping")  # every expert under its GLOBAL weightE name (EP rank 1 holds 4..7)
    assert sorted(names) == sorted(
        f"decoder.layers.{layer}.mlp.experts.linear_fc{fc}.weight{e}"
        for layer in (0, 1)
        for fc in (1, 2)
        for e in range(8)
    )


@pytest.mark.ranks
def test_tp2_ep2_etp2_passes(tmp_path: Path) -> None:
    res = run_cli("verify", "--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "2", "--etp", "2", "--experts",
                  "te-grouped", "--oracle", CORE, "--table", "none", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 0, res.out + res.err
    assert res.verdicts() == dict.fromkeys(CORE.split(","), "pass")
    assert len(_grouped_rows(res, "mapping")) == 32


@pytest.mark.ranks
def test_local_expert_id_in_grouped_export_is_caught(tmp_path: Path) -> None:
    hook = mutant("te_grouped", "grouped_export_local_expert_id")
    res = run_cli("verify", "--model", "tiny:qwen3-moe", "--ep", "2", "--experts", "te-grouped", "--oracle", CORE,
                  "--table", "none", "--hook", hook, tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    verdicts = res.verdicts()
    assert {verdicts[o] for o in ("coverage", "roundtrip", "differential", "mapping")} == {"fail"}
    got = {(f["tensor"], f["kind"]) for f in res.findings("roundtrip")}
    assert ("model.layers.0.mlp.experts.0.gate_proj.weight", "bytes-differ") in got  # holds expert 4's values
    assert ("model.layers.0.mlp.experts.4.gate_proj.weight", "missing") in got
    exp0 = next(f for f in res.findings("roundtrip") if f["tensor"] == "model.layers.0.mlp.experts.0.gate_proj.weight")
    assert "model.layers.0.mlp.experts.4.gate_proj.weight" in exp0["message"]
    mapped = {(f["tensor"], f["kind"]) for f in res.findings("mapping")}
    assert ("model.layers.0.mlp.experts.0.gate_proj.weight", "export-bytes-differ") in mapped
    assert "--experts te-grouped" in res.out  # the replay line keeps the layout option
