"""Differential oracle: real export vs the comm-stub probe, and planted bugs it (or roundtrip's diagnosis) names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import CliResult, mutant, run_cli

ORACLES = "differential,elements,roundtrip"
SHARED_HOOK = f"{Path(__file__).parent / 'support' / 'hooks_shared_probe.py'}:flip_expert3_down_on_rank0"
"""A bug in one routed expert that takes its layer's shared probe slots (convcheck.probe.shared)."""


def _find(result: CliResult, oracle: str, tensor: str) -> dict:
    hits = [f for f in result.findings(oracle) if f["tensor"] == tensor]
    assert hits, f"no {oracle} finding for {tensor}: {[f['tensor'] for f in result.findings(oracle)]}"
    return hits[0]


@pytest.fixture(scope="module")
def qwen3_tp2_plants(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    """One TP2 launch with four planted bugs on distinct tensors."""
    hooks = ["tp_concat_reversed", "gqa_qk_swap_group1", "gate_up_swapped_under_tp", "drop_vocab_rows"]
    args = [a for h in hooks for a in ("--hook", mutant("collectives", h))]
    return run_cli(
        "verify",
        "--model",
        "tiny:qwen3",
        "--tp",
        "2",
        "--oracle",
        ORACLES,
        *args,
        tmp_path=tmp_path_factory.mktemp("p"),
    )


@pytest.mark.ranks
def test_tp_concat_order(qwen3_tp2_plants: CliResult) -> None:
    r = qwen3_tp2_plants
    assert r.code == 1
    d = _find(r, "differential", "model.embed_tokens.weight")
    assert d["kind"] == "differs" and d["detail"]["first_index"] == [0, 0]
    rt = _find(r, "roundtrip", "model.embed_tokens.weight")
    assert rt["detail"]["first_index"] == [0, 0] and rt["detail"]["diagnosis_kind"] == "block-reorder"


@pytest.mark.ranks
def test_gqa_group_swap(qwen3_tp2_plants: CliResult) -> None:
    q = _find(qwen3_tp2_plants, "roundtrip", "model.layers.0.self_attn.q_proj.weight")
    assert q["detail"]["first_index"] == [16, 0]
    assert "q/k swap" in q["detail"]["diagnosis"] and "k_proj" in q["detail"]["diagnosis"]


@pytest.mark.ranks
def test_gate_up_swap(qwen3_tp2_plants: CliResult) -> None:
    g = _find(qwen3_tp2_plants, "roundtrip", "model.layers.0.mlp.gate_proj.weight")
    assert g["detail"]["first_index"] == [32, 0] and "gate/up" in g["detail"]["diagnosis"]


@pytest.mark.ranks
def test_dropped_rows(qwen3_tp2_plants: CliResult) -> None:
    rt = _find(qwen3_tp2_plants, "roundtrip", "lm_head.weight")
    assert rt["kind"] == "shape" and rt["detail"]["diagnosis_kind"] == "dropped"
    el = _find(qwen3_tp2_plants, "elements", "lm_head.weight")
    assert el["kind"] == "shape" and el["detail"]["first_index"] == [144, 0]


@pytest.mark.ranks
def test_other_tensors_pass(qwen3_tp2_plants: CliResult) -> None:
    planted = {"model.embed_tokens.weight", "lm_head.weight"}
    bad = {f["tensor"] for f in qwen3_tp2_plants.findings()}
    assert not {t for t in bad if ".layers.1." in t}, bad
    assert planted <= bad


@pytest.mark.ranks
@pytest.mark.parametrize(
    ("oracles", "real"),
    [(ORACLES, "own conversions"), ("roundtrip,differential,elements", "shared (roundtrip export)")],
    ids=["own-conversions", "in-roundtrip-drain"],
)
def test_ep_local_expert_ids_and_a_stale_gather_off_rank0(tmp_path: Path, oracles: str, real: str) -> None:
    """The same findings whether the differential converts itself or reads the conversions roundtrip's export made
    (convcheck.probe.fused); with them, a bug in one expert that takes its layer's shared probe slots (rank 0's local
    expert 3, neither of the two probed) is named, element and rank, against its own shard."""
    r = run_cli(
        "verify",
        "--model",
        "tiny:qwen3-moe",
        "--ep",
        "2",
        "--oracle",
        oracles,
        "--hook",
        mutant("collectives", "ep_local_ids"),
        "--hook",
        mutant("collectives", "ep_gather_stale_off_rank0"),
        "--hook",
        SHARED_HOOK,
        tmp_path=tmp_path,
    )
    assert r.code == 1
    d = _find(r, "differential", "model.layers.1.mlp.experts.0.up_proj.weight")
    assert d["kind"] == "differs" and d["detail"]["first_index"] == [0, 0]
    miss = _find(r, "differential", "model.layers.1.mlp.experts.4.up_proj.weight")
    assert miss["kind"] == "missing-in-real"
    rt = _find(r, "roundtrip", "model.layers.1.mlp.experts.0.up_proj.weight")
    assert rt["detail"]["diagnosis_kind"] == "renumbered" and "experts.4." in rt["detail"]["diagnosis"]
    # rank 1 hands back its own expert under every global id: rank 0's export (what roundtrip reads) is right, and
    # only the cross-rank digest sees rank 1's experts 0-3 (rank 0's part of its output)
    stale = {f"model.layers.0.mlp.experts.{e}.{p}_proj.weight" for e in range(4) for p in ("gate", "up")}
    flipped = "model.layers.0.mlp.experts.3.down_proj.weight"
    layer0 = {(f["tensor"], f["kind"]) for f in r.findings("differential") if ".layers.0." in f["tensor"]}
    assert layer0 == {(t, "ranks-disagree") for t in stale | {flipped}} | {(flipped, "differs")}, layer0
    assert _find(r, "differential", sorted(stale)[0])["detail"]["rank_groups"] == [[0], [1]]
    d = next(f for f in r.findings("differential") if f["tensor"] == flipped and f["kind"] == "differs")
    assert d["detail"] == {"rank": 0, "first_index": [1, 2], "count": 1}
    assert d["message"].startswith(
        "rank 0: 1 of its elements are not where the probe puts them; first at HF index [1, 2]"
    )
    assert [f["tensor"] for f in r.findings("roundtrip") if ".layers.0." in f["tensor"]] == [flipped]
    assert r.verdicts() == {"roundtrip": "fail", "differential": "fail", "elements": "pass"}  # the probe is right
    metrics = next(o for o in r.report["oracles"] if o["name"] == "differential")["metrics"]
    assert metrics["real"] == real and (real == "own conversions") == ("in_export_s" not in metrics)
    assert metrics["probes_shared"] == 10  # rank 0, fc1 and fc2: 2 layers x 4 local experts but 3 probed
    elements = next(o for o in r.report["oracles"] if o["name"] == "elements")["metrics"]
    assert elements["probes_shared"] == 10  # it reads the differential's records, whose real outputs were checked


@pytest.mark.ranks
def test_etp_expert_not_gathered(tmp_path: Path) -> None:
    r = run_cli(
        "verify",
        "--model",
        "tiny:qwen3-moe",
        "--tp",
        "2",
        "--etp",
        "2",
        "--oracle",
        ORACLES,
        "--hook",
        mutant("collectives", "etp_not_gathered"),
        tmp_path=tmp_path,
    )
    assert r.code == 1
    name = "model.layers.0.mlp.experts.0.down_proj.weight"
    kinds = {f["kind"] for f in r.findings("differential") if f["tensor"] == name}
    assert {"shape", "ranks-disagree"} <= kinds, kinds
    shape = next(f for f in r.findings("differential") if f["tensor"] == name and f["kind"] == "shape")
    assert shape["detail"]["first_index"] == [0, 8]
    rt = _find(r, "roundtrip", name)
    assert rt["kind"] == "shape" and rt["detail"]["diagnosis_kind"] == "dropped"
    assert "columns" in rt["detail"]["diagnosis"]


def _rec(digest: str | None, owned: int = 6, writer: list | None = None) -> dict:
    real = {"shape": [2, 3], "dtype": "bfloat16", "digest": digest}
    return {"task": 0, "param": "p", "hf": "w", "shape": [2, 3], "writer": writer or [], "ranges": [(0, owned)],
            "owned": owned, "real": real}  # fmt: skip


def test_outputs_no_collective_made_are_not_compared_but_a_mixed_build_is_named() -> None:
    """Replicas whose outputs are all their own elements carry no digest (nothing was received); when one rank
    received its output through a gather and another built it alone, the ranks are said to disagree."""
    from convcheck.oracles.differential import assemble

    findings, counts = assemble([[_rec(None)], [_rec(None)]])
    assert findings == [] and counts == {"p": 6}
    findings, _ = assemble([[_rec("a", writer=[["ep", 0]])], [_rec(None)]])
    assert [(f.tensor, f.kind, f.detail["rank_groups"]) for f in findings] == [("w", "ranks-disagree", [[0], [1]])]
    findings, _ = assemble([[_rec("a", writer=[["ep", 0]])], [_rec("b", writer=[["ep", 1]])]])
    assert [f.kind for f in findings] == ["ranks-disagree"]


def test_one_writer_of_part_of_a_tensor_leaves_the_rest_uncovered_and_one_of_all_of_it_is_counted() -> None:
    """One rank's slot over the whole tensor: nothing to find, its elements counted; over part of it: the rest is
    named uncovered; a slot that mismatched is still named."""
    from convcheck.oracles.differential import assemble

    findings, counts = assemble([[_rec(None)]])
    assert findings == [] and counts == {"p": 6}
    findings, counts = assemble([[_rec(None, owned=4)]])
    assert [(f.tensor, f.kind, f.detail["first_index"]) for f in findings] == [("w", "uncovered", [1, 1])]
    assert counts == {"p": 4}
    wrong = {**_rec(None), "mismatch": {"count": 1, "first": [1, 2], "real": "1", "probe": "2"}}
    findings, _ = assemble([[wrong]])
    assert [(f.tensor, f.kind, f.detail["first_index"]) for f in findings] == [("w", "differs", [1, 2])]


def test_an_expert_written_by_its_rank_and_received_by_the_others_is_counted_once_and_checked() -> None:
    """Under EP every rank exports every expert: its own rank's slot writes all of it, the others' none. That is
    counted as one writer of every element; two writers of the same task and writer coordinates (replicas) that place
    elements differently, or a second whole writer, still go through the phases that name them."""
    from convcheck.oracles.differential import assemble

    def expert(rank: int, owns: bool, param: str = "p") -> dict:
        owned = 6 if owns else 0
        return {**_rec("d", owned=owned, writer=[["ep", rank]]), "param": param, "ranges": [(0, 6)] if owns else []}

    findings, counts = assemble([[expert(0, True)], [expert(1, False, "q")], [expert(2, False, "r")]])
    assert findings == [] and counts == {"p": 6, "q": 0, "r": 0}
    replica = {**expert(0, False), "param": "p"}  # rank 1 claims rank 0's writer coordinates but writes nothing
    findings, _ = assemble([[expert(0, True)], [replica]])
    assert [f.kind for f in findings] == ["replica-layout"]
    findings, counts = assemble([[expert(0, True)], [expert(1, True, "q")]])  # two whole writers of equal bytes
    assert findings == [] and counts == {"p": 6, "q": 6}
    wrong = {**expert(1, True, "q"), "mismatch": {"count": 1, "first": [0, 1], "real": "1", "probe": "2"}}
    findings, _ = assemble([[expert(0, True)], [wrong]])
    assert [(f.kind, f.detail.get("first_index")) for f in findings] == [("differs", [0, 1]), ("conflict", [0, 0])]


@pytest.mark.ranks
def test_a_skipped_ep_gather_is_missing_in_real_inside_roundtrips_drain(tmp_path: Path) -> None:
    """ep_not_gathered: each rank exports only its own experts, as views of its weights. Inside roundtrip's drain
    those views must not stand in for the probe (a gather is due under EP): the probe's slots name the experts
    the real export lacks."""
    r = run_cli("verify", "--model", "tiny:qwen3-moe", "--ep", "2", "--oracle", "roundtrip,differential",
                "--hook", mutant("collectives", "ep_not_gathered"), tmp_path=tmp_path)  # fmt: skip
    assert r.code == 1 and r.verdicts() == {"roundtrip": "fail", "differential": "fail"}
    d = _find(r, "differential", "model.layers.0.mlp.experts.0.down_proj.weight")
    assert d["kind"] == "missing-in-real" and d["detail"] == {"rank": 1, "first_index": [0, 0]}
    metrics = next(o for o in r.report["oracles"] if o["name"] == "differential")["metrics"]
    assert metrics["real"] == "shared (roundtrip export)"


PROBES_SHARED_4L_TP2 = 2 * (4 * 8 - 3) + 2 * 7
"""Rank 0's tasks on shared slots at TP2, four layers: of fc1 and of fc2, every layer's eight experts but layer 0's
experts 0 and 1 and layer 1's expert 0 (probed: the first, the one that confirms the expert number, the one that
confirms the layer number); and layers 2 and 3's seven non-expert tasks (qkv, its norm, q and k norms, o_proj, pre-MLP
norm, router)."""
LAYER_HOOKS = [
    f"{Path(__file__).parent / 'support' / 'hooks_layer_probe.py'}:{name}"
    for name in ("flip_layer3_o_proj_on_rank0", "flip_layer3_expert5_down_on_rank0")
]
"""Bugs in one layer's task that takes the shared probe slots of the same task of earlier layers: a non-expert one,
and an expert whose slots are another layer's other expert's, renamed."""


@pytest.mark.ranks
def test_a_bug_in_a_layer_that_takes_shared_slots_is_named(tmp_path: Path) -> None:
    """TP2, four layers: each non-expert task of layers 2 and 3 takes the probe slots of layer 0's, renamed (layers 0
    and 1 probed and found equal), and layer 3's expert 5 those of layer 0's expert 0, renamed in both numbers; layer
    3's o_proj gathered wrong and its expert 5 down_proj converted wrong, on rank 0 only, are each named by their first
    element (the expert, whole on both ranks and built by no collective, is not compared across ranks)."""
    hooks = [a for h in LAYER_HOOKS for a in ("--hook", h)]
    r = run_cli(
        "verify", "--model", "tiny:qwen3-moe-4l", "--tp", "2", "--oracle", "differential", *hooks, tmp_path=tmp_path,
    )  # fmt: skip
    assert r.code == 1 and r.verdicts() == {"differential": "fail"}
    targets = ("model.layers.3.self_attn.o_proj.weight", "model.layers.3.mlp.experts.5.down_proj.weight")
    found = {(f["tensor"], f["kind"]) for f in r.findings("differential")}
    assert found == {(targets[0], "ranks-disagree"), *((t, "differs") for t in targets)}, found
    for target in targets:
        d = next(f for f in r.findings("differential") if f["kind"] == "differs" and f["tensor"] == target)
        assert d["detail"] == {"rank": 0, "first_index": [1, 2], "count": 1}
    metrics = next(o for o in r.report["oracles"] if o["name"] == "differential")["metrics"]
    assert metrics["probes_shared"] == PROBES_SHARED_4L_TP2
