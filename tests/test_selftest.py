"""`convcheck selftest`: the mutant catalog, planning, attribution and the kill matrix (synthetic Reports), and
one real run on a small subset."""

from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from convcheck.errors import SetupError
from convcheck.mutants.catalog import FORWARD, MUTANTS, Mutant
from convcheck.oracles import DEFAULT_ORACLES as ORACLES
from convcheck.verdict import Finding, OracleVerdict, Report
from convcheck.workflows.kill_matrix import CAUGHT, ERROR, MISSED, NOT_RUN, attribute
from convcheck.workflows.selftest import check_catalog, clean_launches, plan, run_selftest, select
from convcheck.workflows.targets import globs_meet
from tests.support.helpers import run_cli

BY_NAME = {m.name: m for m in MUTANTS}
MUTANT_MODULES = ("bridge", "collectives", "config", "hybrid", "mamba", "symmetric", "te_grouped")


# --- the catalog ---------------------------------------------------------------------------------------------------


def test_catalog_has_enough_unique_mutants_and_is_sound() -> None:
    assert len(MUTANTS) >= 30
    assert len(BY_NAME) == len(MUTANTS)
    assert check_catalog(MUTANTS, deep=True) == []  # fixtures, layouts legal for each model, oracles, hooks


def test_every_hook_resolves_to_a_function() -> None:
    from convcheck.hooks import load_hook

    for m in MUTANTS:
        assert inspect.isfunction(load_hook(m.hook)), m.name
        assert m.hook.startswith("convcheck.mutants."), m.name


def test_every_shipped_mutant_is_catalogued() -> None:
    """Each public hook of the conversion-bug modules (not faults.py) has a catalog entry."""
    hooks = {m.hook for m in MUTANTS}
    for module_name in MUTANT_MODULES:
        module = importlib.import_module(f"convcheck.mutants.{module_name}")
        public = [n for n, f in vars(module).items() if inspect.isfunction(f) and f.__module__ == module.__name__]
        for name in (n for n in public if not n.startswith("_")):
            assert f"convcheck.mutants.{module_name}:{name}" in hooks, name


def test_catches_are_known_oracles_and_logits_is_a_forward_target() -> None:
    for m in MUTANTS:
        assert set(m.catches) <= set(ORACLES) if m.via == "hook" else m.catches == ("engine",), m.name
        if FORWARD in m.catches:
            assert FORWARD in m.targets or "*" in m.targets, m.name


def test_check_catalog_names_each_problem() -> None:
    good = BY_NAME["transpose_o_proj"]
    bad = (
        good,
        replace(good, description="two\nlines"),
        replace(good, name="x1", catches=("nope",)),
        replace(good, name="x2", hook="convcheck.mutants.bridge:no_such_hook"),
        replace(good, name="x3", layout="tp3"),
        replace(good, name="x4", fixture="tiny:qwen9"),
        replace(good, name="x5", experts="grouped-gemm"),
    )
    problems = check_catalog(bad, deep=True)
    assert any("unique" in p for p in problems)
    assert any(p.startswith("transpose_o_proj: the description") for p in problems)
    assert any(p.startswith("x1: catches") and "nope" in p for p in problems)
    assert any(p.startswith("x2:") and "no_such_hook" in p for p in problems)
    assert any(p.startswith("x3:") and "tp=3" in p for p in problems)
    assert any(p.startswith("x4:") and "unknown fixture" in p for p in problems)
    assert any(p.startswith("x5:") and "unknown expert layout" in p for p in problems)


# --- planning ---------------------------------------------------------------------------------------------------


def test_globs_meet() -> None:
    assert globs_meet("*.layers.0.self_attn.q_proj.weight", "*.layers.0.self_attn.[qk]_proj.weight")
    assert not globs_meet("*.layers.0.self_attn.o_proj.weight", "*.layers.0.self_attn.[qk]_proj.weight")
    assert not globs_meet("*.layers.1.mlp.experts.3.*", "*.layers.0.mlp.experts.*.down_proj.weight")
    assert globs_meet("*.layers.*.mlp.experts.*", "*.layers.1.mlp.experts.*")
    assert globs_meet("*", "model.norm.weight")
    assert not globs_meet("rms_norm_eps -> layernorm_epsilon", "*.weight")


def _m(name: str, targets: tuple[str, ...], catches: tuple[str, ...] = ("roundtrip",), **kw: Any) -> Mutant:
    base = {"description": name, "hook": f"x:{name}", "fixture": "tiny:qwen3", "layout": "tp2"}
    return Mutant(name=name, catches=catches, targets=targets, **{**base, **kw})


A = _m("a", ("model.embed_tokens.weight",))
B = _m("b", ("*.layers.0.self_attn.[qk]_proj.weight",), catches=("roundtrip", "mapping"))
B2 = _m("b2", ("model.layers.0.self_attn.q_proj.weight",))  # overlaps B
F1 = _m("f1", ("*.layers.1.mlp.down_proj.weight", FORWARD), catches=("mapping", "logits"))
F2 = _m("f2", ("rope_parameters.rope_theta -> rotary_base", FORWARD), catches=("config", "logits"))
L1 = _m("l1", (FORWARD,), catches=("logits",))
T1 = _m("t1", ("model.norm.weight",), layout="tp1", more_layouts=("tp2",))


def test_quick_shares_launches_only_between_disjoint_targets() -> None:
    launches = plan([A, B, B2, T1], quick=True)
    assert [[m.name for m in lay.mutants] for lay in launches] == [["a", "b"], ["b2"], ["t1"]]
    assert launches[0].oracles == ("roundtrip", "mapping") and launches[0].layout == "tp2"
    assert launches[2].layout == "tp1"  # quick: the first layout only
    clean = clean_launches(launches)
    assert [(c.fixture, c.layout, c.oracles, c.mutants) for c in clean] == [
        ("tiny:qwen3", "tp2", ("roundtrip", "mapping"), ()),
        ("tiny:qwen3", "tp1", ("roundtrip",), ()),
    ]


def test_full_runs_each_mutant_alone_at_every_layout_with_every_oracle() -> None:
    launches = plan([A, T1], quick=False)
    assert [(lay.layout, [m.name for m in lay.mutants]) for lay in launches] == [
        ("tp2", ["a"]), ("tp1", ["t1"]), ("tp2", ["t1"])
    ]  # fmt: skip
    assert all(lay.oracles == tuple(ORACLES) for lay in launches)
    te = _m("te", ("x",), experts="te-grouped", layout="ep2", fixture="tiny:qwen3-moe")
    assert "logits" in plan([te], quick=False)[0].oracles  # the grouped stand-in runs the forward too


def test_quick_runs_logits_only_where_one_mutant_can_change_the_forward() -> None:
    (shared,) = plan([F1, F2], quick=True)  # disjoint tensors: one launch, but two forward changes
    assert "logits" not in shared.oracles and set(shared.oracles) == {"config", "mapping"}
    first, second = plan([F1, A, L1], quick=True)  # L1 needs logits (its only catcher): apart from F1
    assert [m.name for m in first.mutants] == ["f1", "a"] and "logits" in first.oracles
    assert [m.name for m in second.mutants] == ["l1"] and second.oracles == ("logits",)


def test_select_filters_by_fixture_and_name() -> None:
    assert {m.fixture for m in select(MUTANTS, ["tiny:llama"])} == {"tiny:llama"}
    assert [m.name for m in select(MUTANTS, (), ["eps_off"])] == ["eps_off"]
    from convcheck.errors import BadInput

    with pytest.raises(BadInput, match="unknown mutant"):
        select(MUTANTS, (), ["nope"])
    with pytest.raises(BadInput, match="unknown fixture"):
        select(MUTANTS, ["tiny:nope"])
    with pytest.raises(BadInput, match="no mutant matches"):
        select(MUTANTS, ["tiny:llama"], ["eps_off"])


# --- attribution and the matrix on synthetic Reports ------------------------------------------------------------------


def _finding(name: str, kind: str = "bytes-differ", **detail: Any) -> Finding:
    return Finding(tensor=name, kind=kind, message=f"{name} is wrong", detail=detail)


def _report(findings: dict[str, list[Finding]], oracles: tuple[str, ...]) -> Report:
    verdicts = tuple(OracleVerdict(name=o, checked=3, findings=tuple(findings.get(o, ()))) for o in oracles)
    return Report(model="tiny:qwen3", layout={"tp": 2}, device="cpu", versions={}, oracles=verdicts)


def test_attribute_credits_each_finding_to_the_mutant_that_names_it() -> None:
    report = _report(
        {
            "roundtrip": [_finding("model.embed_tokens.weight"), _finding("model.layers.0.self_attn.k_proj.weight")],
            "logits": [_finding("logits", "logits-differ"), _finding("greedy-tokens", "greedy-differs")],
            "layout": [_finding("<layout>", "first-differing", tensor="model.embed_tokens.weight")],
            "mapping": [_finding("model.norm.weight")],
        },
        ("roundtrip", "logits", "layout", "mapping"),
    )
    found = attribute(report, [A, B, F1])
    assert {o: len(f) for o, f in found.credited["a"].items()} == {"roundtrip": 1, "layout": 1}
    assert list(found.credited["b"]) == ["roundtrip"]
    assert {o: len(f) for o, f in found.credited["f1"].items()} == {"logits": 2}
    assert [(o, f.tensor) for o, f in found.unclaimed] == [("mapping", "model.norm.weight")]
    both = attribute(_report({"roundtrip": [_finding("model.layers.0.self_attn.q_proj.weight")]}, ("roundtrip",)),
                     [B, B2])  # fmt: skip
    assert len(both.unclaimed) == 1 and not both.credited["b"] and not both.credited["b2"]
    alone = attribute(_report({"roundtrip": [_finding("anything")]}, ("roundtrip",)), [A])
    assert list(alone.credited["a"]) == ["roundtrip"]  # a lone mutant owns every finding


class FakeVerify:
    """Stands in for api.verify in the planning tests: each hook's findings per oracle, as a Report."""

    def __init__(self, effects: dict[str, dict[str, list[str]]], fail_hooks: tuple[str, ...] = ()) -> None:
        self.effects, self.fail_hooks, self.calls = effects, fail_hooks, []

    def __call__(self, model: str, layout: str, *, oracles: tuple[str, ...], hooks: tuple[str, ...], experts: str,
                 timeout_s: float, device: str = "auto", spec: str = "local") -> Report:  # fmt: skip
        self.calls.append((model, layout, tuple(hooks), tuple(oracles)))
        if any(h in self.fail_hooks for h in hooks):
            raise SetupError("rank 1 died with exit code 9")
        findings: dict[str, list[Finding]] = {}
        for hook in hooks or ("clean",):
            for oracle, tensors in self.effects.get(hook, {}).items():
                findings.setdefault(oracle, []).extend(_finding(t) for t in tensors)
        return _report(findings, oracles)


def test_kill_matrix_cells_and_verdict() -> None:
    fake = FakeVerify({"x:a": {"roundtrip": ["model.embed_tokens.weight"]},
                       "x:b": {"mapping": ["decoder.layers.0.self_attention.linear_qkv.weight",
                                           "model.layers.0.self_attn.q_proj.weight"]}})  # fmt: skip
    b = replace(B, targets=(*B.targets, "decoder.layers.0.self_attention.linear_qkv.weight"))
    result = run_selftest([A, b], quick=True, verify=fake)
    assert len(fake.calls) == 2 and fake.calls[0][2] == ()  # the clean run first, then one shared launch
    assert result.passed and not result.survivors and result.launches == 2
    a_row, b_row = result.rows
    assert a_row.cells["roundtrip"] == CAUGHT and a_row.cells["mapping"] == MISSED
    assert a_row.cells["coverage"] == NOT_RUN and a_row.shared_with == ("b",)
    assert b_row.cells["roundtrip"] == MISSED and b_row.cells["mapping"] == CAUGHT
    assert b_row.expected_missed == ("roundtrip",)
    assert b_row.first_finding.startswith("mapping: decoder.layers.0.self_attention.linear_qkv.weight [bytes-differ]")
    data = json.loads(json.dumps(result.to_dict()))
    assert data["verdict"] == "pass" and data["oracles"] == list(ORACLES)
    assert data["mutants"][1]["cells"]["mapping"] == "caught" and data["clean"][0]["verdict"] == "pass"


def test_rows_follow_the_catalog_and_layout_order() -> None:
    fake = FakeVerify(
        {"x:a": {"roundtrip": ["model.embed_tokens.weight"]}, "x:t1": {"roundtrip": ["model.norm.weight"]}}
    )
    result = run_selftest([A, T1], quick=False, verify=fake)
    assert [c[:2] for c in fake.calls if c[2]] == [("tiny:qwen3", "tp2"), ("tiny:qwen3", "tp2"), ("tiny:qwen3", "tp1")]
    assert [(r.mutant.name, r.layout) for r in result.rows] == [("a", "tp2"), ("t1", "tp1"), ("t1", "tp2")]
    assert result.passed and len(result.clean) == 2


def test_survivor_false_alarm_and_error_fail_the_selftest() -> None:
    fake = FakeVerify({}, fail_hooks=("x:b",))
    result = run_selftest([A, replace(B, layout="tp1")], quick=True, verify=fake)
    assert not result.passed and not result.false_alarms
    a_row, b_row = result.rows
    assert not a_row.killed and a_row.cells["roundtrip"] == MISSED and a_row.first_finding is None
    assert not b_row.killed and b_row.cells["roundtrip"] == ERROR and b_row.cells["coverage"] == NOT_RUN
    assert "rank 1 died" in b_row.first_finding
    te = _m("te", ("model.layers.0.mlp.experts.*",), experts="te-grouped", layout="ep2", fixture="tiny:qwen3-moe")
    (row,) = run_selftest([te], quick=False, verify=FakeVerify({})).rows
    assert row.cells["logits"] == row.cells["layout"] == MISSED  # every oracle applies to the grouped layout


def test_clean_run_with_a_finding_is_a_false_alarm() -> None:
    fake = FakeVerify({"clean": {"roundtrip": ["lm_head.weight"]}, "x:a": {"roundtrip": ["model.embed_tokens.weight"]}})
    result = run_selftest([A], quick=True, verify=fake)
    assert result.rows[0].killed and not result.passed
    (alarm,) = result.false_alarms
    assert alarm.failing == ("roundtrip",) and alarm.first_finding.startswith("roundtrip: lm_head.weight")


def test_unclaimed_finding_in_a_shared_launch_reruns_its_mutants_alone() -> None:
    fake = FakeVerify({"x:a": {"roundtrip": ["model.embed_tokens.weight", "model.norm.weight"]},
                       "x:b": {"roundtrip": ["model.layers.0.self_attn.k_proj.weight"]}})  # fmt: skip
    result = run_selftest([A, B], quick=True, verify=fake)
    assert [c[2] for c in fake.calls] == [(), ("x:a", "x:b"), ("x:a",), ("x:b",)]
    assert result.launches == 4 and result.passed
    assert all(r.note.startswith("ran alone") and r.shared_with == () for r in result.rows)


# --- the command line ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--model", "tiny:nope"), "unknown fixture"),
        (("--only", "nope"), "unknown mutant"),
        (("--model", "tiny:llama", "--json", "/no/such/dir/m.json"), "output folder does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    res = run_cli("selftest", "--quick", *args)
    assert res.code == 2 and needle in res.err
    assert len(res.err.strip().splitlines()) == 1, res.err


@pytest.mark.ranks
def test_quick_selftest_on_two_llama_mutants(tmp_path: Path) -> None:
    """Real run: a clean launch and one shared launch of two mutants at TP1 (roundtrip, mapping)."""
    out = tmp_path / "matrix.json"
    res = run_cli("selftest", "--quick", "--only", "transpose_o_proj,swap_qk_head0", "--json", str(out), timeout=400)
    assert res.code == 0, res.out + res.err
    data = json.loads(out.read_text())
    assert data["verdict"] == "pass" and data["quick"] and data["launches"] == 2
    rows = {r["name"]: r for r in data["mutants"]}
    for name in ("transpose_o_proj", "swap_qk_head0"):
        cells = rows[name]["cells"]
        assert {cells["roundtrip"], cells["mapping"]} == {"caught"}, (name, cells)
        assert {c for o, c in cells.items() if o not in ("roundtrip", "mapping")} == {"not run"}
        assert rows[name]["killed"] and not rows[name]["expected_missed"]
    assert rows["transpose_o_proj"]["first_finding"].startswith(
        "roundtrip: model.layers.0.self_attn.o_proj.weight [bytes-differ]"
    )
    assert rows["swap_qk_head0"]["shared_with"] == ["transpose_o_proj"]
    assert [(c["fixture"], c["layout"], c["verdict"]) for c in data["clean"]] == [("tiny:llama", "tp1", "pass")]
    assert "KILLED transpose_o_proj" in res.out and "PASS selftest: 2/2 mutants killed" in res.out


def test_an_errored_mutant_is_never_killed_and_fails_the_selftest() -> None:
    result = run_selftest([A], quick=True, verify=FakeVerify({"x:a": {}}, fail_hooks=("x:a",)))
    (row,) = result.rows
    assert row.status == "errored" and not row.killed and row.cells["roundtrip"] == ERROR
    assert result.survivors == (row,) and not result.passed
    data = result.to_dict()
    assert data["counts"] == {"killed": 0, "survived": 0, "errored": 1, "skipped": 0}
    assert data["mutants"][0]["status"] == "errored" and data["verdict"] == "fail"


def test_device_cuda_skips_what_the_host_cannot_hold_and_names_why() -> None:
    fake = FakeVerify({"x:a": {"roundtrip": ["model.embed_tokens.weight"]}})
    result = run_selftest([A, replace(B, layout="tp1")], quick=False, verify=fake, device="cuda")  # 0 GPUs here
    assert fake.calls == [] and result.launches == 0
    assert [r.status for r in result.rows] == ["skipped", "skipped"]
    assert "--device cuda needs 2 GPU(s)" in result.rows[0].skipped and "0 visible" in result.rows[0].skipped
    assert all(c.skipped for c in result.clean) and not result.passed  # nothing ran: no pass


def test_jobs_give_the_rows_of_a_serial_run() -> None:
    effects = {"x:a": {"roundtrip": ["model.embed_tokens.weight"]}, "x:t1": {"roundtrip": ["model.norm.weight"]}}
    serial = run_selftest([A, T1], quick=False, verify=FakeVerify(effects))
    parallel = run_selftest([A, T1], quick=False, verify=FakeVerify(effects), jobs=3)
    assert [r.to_dict() for r in parallel.rows] == [r.to_dict() for r in serial.rows]
    assert [c.to_dict() for c in parallel.clean] == [c.to_dict() for c in serial.clean]
    assert parallel.launches == serial.launches == 5 and parallel.passed
    assert {r.device for r in parallel.rows} == {"cpu"}


def test_partial_matrices_after_each_fixture_layout_end_in_the_complete_one() -> None:
    effects = {"x:a": {"roundtrip": ["model.embed_tokens.weight"]}, "x:t1": {"roundtrip": ["model.norm.weight"]}}
    seen: list[dict] = []
    result = run_selftest([A, T1], quick=False, verify=FakeVerify(effects), partial=lambda r: seen.append(r.to_dict()))
    assert [len(s["mutants"]) for s in seen] == [2, 3]  # tp2 (a, t1), then tp1 (t1)
    assert {s["verdict"] for s in seen} == {"incomplete"} and not any(s["complete"] for s in seen)
    final = result.to_dict()
    assert final["complete"] and final["verdict"] == "pass" and final["mutants"] == seen[-1]["mutants"]


# --- engine-path mutants (the engine oracle, its own environment) ---------------------------------------------------

E1 = _m("e1", ("model.layers.1.*",), catches=("engine",), via="sender", fixture="tiny:qwen3-vllm")
E2 = _m("e2", ("model.layers.0.*",), catches=("engine",), via="engine-receiver", options=(("engine_delta", "on"),),
        fixture="tiny:qwen3-vllm")  # fmt: skip


class EngineVerify:
    """api.verify's stand-in for engine launches: a sender's launch finds one tensor, anything else nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, model: str, layout: str, *, oracles: tuple[str, ...], hooks: tuple[str, ...], experts: str,
                 timeout_s: float, device: str = "auto", spec: str = "local", sender: str | None = None,
                 options: dict[str, str] | None = None) -> Report:  # fmt: skip
        self.calls.append((model, tuple(oracles), tuple(hooks), sender, options))
        found = [_finding("model.layers.1.self_attn.qkv_proj.weight", "engine-differs")] if sender else []
        return _report({"engine": found} if found else {}, oracles)


def test_engine_mutants_run_alone_with_the_engine_oracle_and_their_sender_or_receiver(monkeypatch: Any) -> None:
    import convcheck.workflows.selftest as lib

    monkeypatch.setattr(lib, "check_python", lambda _python, **_how: "/engine/python")
    launches = plan([A, E1, E2], quick=True)
    assert [[m.name for m in lay.mutants] for lay in launches] == [["a"], ["e1"], ["e2"]]
    sent, received = launches[1:]
    assert sent.oracles == ("engine",) and sent.sender == "x:e1" and sent.hooks == () and sent.options == {}
    assert received.sender is None and received.options == {"engine_delta": "on", "engine_receiver": "x:e2"}
    assert plan([E1], quick=False)[0].oracles == ("engine",)
    real = replace(E2, hook="convcheck.mutants.engine_receivers:load_weights_directly")
    assert check_catalog(
        [real, replace(real, name="e3", via="rank"), replace(real, name="e4", options=(("save_dtype", "bf16"),))]
    ) == [
        "e3: via must be one of hook, sender, engine-receiver, got 'rank'",
        "e4: options must be those of the oracles it is caught by, got save_dtype",
    ]
    fake = EngineVerify()
    result = run_selftest([E1, E2], quick=True, verify=fake)
    assert fake.calls == [
        ("tiny:qwen3-vllm", ("engine",), (), None, None),  # the clean run: default options
        ("tiny:qwen3-vllm", ("engine",), (), "x:e1", None),
        ("tiny:qwen3-vllm", ("engine",), (), None, {"engine_delta": "on", "engine_receiver": "x:e2"}),
    ]
    killed, survived = result.rows
    assert killed.status == "killed" and killed.cells["engine"] == CAUGHT and killed.cells["roundtrip"] == NOT_RUN
    assert killed.first_finding.startswith("engine: model.layers.1.self_attn.qkv_proj.weight [engine-differs]")
    assert survived.status == "survived" and survived.expected_missed == ("engine",)
    assert result.oracles == (*ORACLES, "engine") and not result.passed
    data = json.loads(json.dumps(result.to_dict()))
    assert data["oracles"][-1] == "engine" and data["mutants"][1]["via"] == "engine-receiver"
    assert data["mutants"][1]["options"] == {"engine_delta": "on"} and data["clean"][0]["oracles"] == ["engine"]


def test_without_the_engine_environment_engine_rows_are_skipped_in_one_line(monkeypatch: Any) -> None:
    import io

    from rich.console import Console

    import convcheck.workflows.selftest as lib
    from convcheck.cli.selftest import print_matrix
    from convcheck.errors import BadInput

    why = "no engine environment for the engine oracle: /x/.venv-vllm/bin/python does not exist; run `make env-vllm`"

    def missing(_python: str | None, **_how: str) -> str:
        raise BadInput(why)

    monkeypatch.setattr(lib, "check_python", missing)
    fake = FakeVerify({"x:a": {"roundtrip": ["model.embed_tokens.weight"]}})
    result = run_selftest([A, E1], quick=True, verify=fake)
    assert [c[2] for c in fake.calls] == [(), ("x:a",)]  # a's clean run and launch; nothing of the engine's
    a_row, e_row = result.rows
    assert a_row.status == "killed" and e_row.status == "skipped" and e_row.skipped == f"skipped: {why}"
    assert [c.skipped for c in result.clean] == ["", f"skipped: {why}"]
    assert result.passed  # what could run, ran and passed
    out = io.StringIO()
    print_matrix(result, Console(file=out, width=400))
    assert f"SKIPPED e1 (tp2): skipped: {why}" in out.getvalue()


def test_a_packing_only_engine_misuse_is_skipped_where_the_engine_packs_nothing(monkeypatch: Any) -> None:
    """Mutant.engine_packing (model.load_weights past vLLM's reload path): a bug only where the CPU backend packs its
    dense weights away; on a host whose vLLM packs nothing its launch is skipped with the reason, elsewhere it runs."""
    import convcheck.workflows.selftest as lib

    monkeypatch.setattr(lib, "check_python", lambda _python, **_how: "/engine/python")
    packing = replace(E2, name="e5", engine_packing=True)
    for packs, ran in ((False, []), (True, ["e5"])):
        monkeypatch.setattr(lib, "engine_packs_weights", lambda _python, _p=packs: _p)
        fake = EngineVerify()
        result = run_selftest([packing], quick=True, verify=fake)
        (row,) = result.rows
        assert [c[4]["engine_receiver"] for c in fake.calls if c[4]] == [packing.hook for _ in ran]
        assert (row.skipped == f"skipped: {lib.NO_PACKING}") == (not packs), row.skipped
