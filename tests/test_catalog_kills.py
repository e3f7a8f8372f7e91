"""Every mutant of the catalog runs in CI: one test per launch of the quick selftest plan (mutants with disjoint
targets share a launch, as `convcheck selftest --quick` does), each asserting that every mutant of the launch is
killed by every oracle the catalog expects to catch it, nothing errored, and every finding is credited to exactly
one mutant. The clean runs of those fixture x layouts are the verify matrix's shared runs where it has them.

The engine-path entries (convcheck.mutants.catalog_engine: the engine oracle, a real vLLM) are killed in
tests/test_engine.py, on the runs whose whole verdicts those tests assert (each launch runs once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from convcheck import api
from convcheck.mutants.catalog import MUTANTS
from convcheck.verdict import OracleVerdict, Report
from convcheck.workflows.kill_matrix import Launch, clean_row
from convcheck.workflows.selftest import Runner, clean_launches, plan, run_clean, run_launch
from tests.support.cases import CASES
from tests.support.helpers import matrix_run
from tests.test_verify_matrix import default_oracles

ENGINE = "engine"
LAUNCHES = [launch for launch in plan(MUTANTS, quick=True) if ENGINE not in launch.oracles]
CLEAN = clean_launches(LAUNCHES)


def _id(launch: Launch) -> str:
    """e.g. `qwen3-tp2` or `qwen3-moe-ep2-te-grouped`, then the mutant count and the first mutant."""
    experts = "" if launch.experts == "sequential" else f"-{launch.experts}"
    spec = "" if launch.spec == "local" else f"-{launch.spec}"
    where = f"{launch.fixture.removeprefix('tiny:')}-{launch.layout}{experts}{spec}"
    return f"{where}-{len(launch.mutants)}m-{launch.mutants[0].name}" if launch.mutants else where


def _matrix_args(launch: Launch) -> tuple[str, ...] | None:
    """The verify-matrix case that is this clean launch (same fixture, layout and expert layout), if any."""
    return next(
        (
            lay
            for name, lay in CASES
            if f"tiny:{name}" == launch.fixture and _spec(lay) == (launch.layout, launch.experts, launch.spec)
        ),
        None,
    )


def _spec(layout: tuple[str, ...]) -> tuple[str, str, str]:
    """(grid spec, expert layout, layer specs) of a verify-matrix layout, e.g. ("ep2", "te-grouped", "local")."""
    from tests.support.cases import gate_case

    if "--pad-vocab" in layout:
        return ("", "", "")  # the padded vocabulary is a case of its own, never a catalog launch's clean run
    case = gate_case("x", layout)
    return case.layout.spec, case.experts, case.spec


def test_no_catalog_entry_is_left_out_of_the_plan() -> None:
    from tests.test_engine import LAUNCHES as ENGINE_LAUNCHES

    planned = [m.name for launch in LAUNCHES for m in launch.mutants] + list(ENGINE_LAUNCHES)
    assert sorted(planned) == sorted(m.name for m in MUTANTS)  # each mutant exactly once
    assert {c.key for c in CLEAN} == {launch.key for launch in LAUNCHES}


@pytest.mark.ranks
@pytest.mark.parametrize("launch", LAUNCHES, ids=[_id(x) for x in LAUNCHES])
def test_catalog_launch_kills_every_mutant(launch: Launch) -> None:
    rows = run_launch(Runner(verify=api.verify, device="cpu", timeout_s=600), launch)
    assert sorted(r.mutant.name for r in rows) == sorted(m.name for m in launch.mutants)
    for row in rows:
        m = row.mutant
        assert row.status == "killed", f"{m.name}: {row.status} ({row.first_finding})"
        assert row.expected_missed == (), f"{m.name}: expected but missed by {row.expected_missed}"
        assert row.device == "cpu" and row.findings, m.name
        assert {f["oracle"] for f in row.findings} >= set(m.catches) & set(launch.oracles), m.name


@pytest.mark.ranks
@pytest.mark.parametrize("launch", CLEAN, ids=[_id(c) for c in CLEAN])
def test_catalog_fixture_layout_runs_clean(launch: Launch, shared_root: Path) -> None:
    """No false alarm where the mutants run: the verify matrix's shared run (every default oracle), else a launch."""
    layout = _matrix_args(launch)
    if layout is not None:
        res, _ = matrix_run(shared_root, launch.fixture.removeprefix("tiny:"), layout)
        assert res.code in (0, 1) and res.report is not None, res.out[-2000:] + res.err[-2000:]
        ran = [o["name"] for o in res.report["oracles"]]
        assert ran == list(default_oracles(layout)) and set(ran) >= set(launch.oracles)
        oracles = tuple(OracleVerdict.from_dict(o) for o in res.report["oracles"])
        report = Report(model=launch.fixture, layout=res.report["layout"], device="cpu", versions={}, oracles=oracles)
        row = clean_row(launch, report, None, 0.0)
        assert row.passed and row.failing == (), row.first_finding  # known bridge bugs only (tagged), if any
        assert (res.code == 0) == (row.upstream_bugs == ())
        return
    row = run_clean(Runner(verify=api.verify, device="cpu", timeout_s=600), launch)
    assert row.passed and row.failing == () and row.device == "cpu", row.first_finding
