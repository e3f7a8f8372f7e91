"""convcheck.live inside a job that is not convcheck's: tests/live_trainer.py stands for a user's trainer (its own
torch.distributed and parallel_state init, its own AutoBridge model, weights perturbed as a training step would) and
calls convcheck.live.check clean, then with a planted mapping bug, and convcheck.live.digest. One launch per case
(ranks forked by the session's warm server, else torchrun) answers every test of the case."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

from convcheck.api import resolve_model
from convcheck.errors import BadInput
from tests.support.helpers import ROOT, locked, run_cli, run_rank_script

CASES = {
    "qwen3-tp2": ("tiny:qwen3", 2, 1, 1, "coverage,differential,mapping,receiver,idempotence", "bucketed"),
    "qwen3-moe-tp2ep2": ("tiny:qwen3-moe", 2, 2, 1, "coverage,differential,elements,mapping", ""),
    "qwen3-pp2": ("tiny:qwen3", 1, 1, 2, "coverage,differential,elements,mapping", ""),
    "qwen2-tied-dp2": ("tiny:qwen2-tied", 1, 1, 1, "coverage,differential,elements,mapping", ""),
    "qwen2-tied-4l-pp2first1last3": ("tiny:qwen2-tied-4l", 1, 1, 2, "coverage,differential,elements,mapping", ""),
    "qwen3-moe-pp2vpp2": ("tiny:qwen3-moe-4l", 1, 1, 2, "coverage,differential,elements,mapping", ""),
}
"""fixture, TP, EP, PP, the clean check's oracles, its sender (the planted check: coverage, differential, mapping). The
chunks are DDP-wrapped in every case; the PP2 case (each stage holds its own layer) passes the job's
ProcessGroupCollection to every call."""
VPP = {"qwen3-moe-pp2vpp2": 2}
"""Virtual pipeline chunks per stage per case (default 1): PP2 x VPP2 over 4 layers puts layers 0 and 2 on stage 0's
two chunks, 1 and 3 on stage 1's."""
SPLIT = {"qwen2-tied-4l-pp2first1last3": "1,3"}
"""Decoder layers of the first and last stage per case (default even): 1 and 3 of the 4 layers."""
DP = {"qwen2-tied-dp2": 2}
"""Data-parallel replicas of the whole model per case (default 1): the DP2 case runs two ranks at TP1, each holding
the whole model, as a data-parallel trainer does (a model with tied embeddings and q/k/v biases)."""
QKV_RANKS = {"qwen2-tied-dp2": [0, 1]}
"""The ranks whose QKV shard holds head 0 (default rank 0 alone: TP rank 0 of the first stage); every replica's."""
QK_BUG = ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.q_proj.weight")
"""What convcheck.mutants.bridge:swap_qk_head0 changes in the export."""
QKV = "decoder.layers.0.self_attention.linear_qkv.weight"
QKV_SHARD = {1: "512/2048", 2: "512/1024"}
"""By TP: the elements of TP rank 0's QKV shard the swap of head 0 changes."""


def launch(shared_root: Path, case: str) -> tuple[dict[str, Any], Path]:
    """The trainer's result for `case`, launched once per session (the first test to ask runs it)."""
    fixture, tp, ep, pp, oracles, sender = CASES[case]
    folder = shared_root / "live-runs" / case
    with locked(folder):
        result = folder / "result.json"
        if not result.exists():
            nproc = math.lcm(tp, ep) * pp * DP.get(case, 1)
            args = [
                resolve_model(fixture),
                str(tp),
                str(ep),
                str(pp),
                oracles,
                str(folder),
                *([sender] if sender else []),
            ]
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "OMP_NUM_THREADS": "1",
                "LIVE_VPP": str(VPP.get(case, 1)),
                "LIVE_PP_SPLIT": SPLIT.get(case, ""),
            }
            log = run_rank_script(ROOT / "tests" / "live_trainer.py", args, nproc, env, folder, timeout=400)
            assert result.exists(), f"the trainer wrote no result: {log[-3000:]}"
        return json.loads(result.read_text()), folder


@pytest.mark.ranks
@pytest.mark.parametrize("case", sorted(CASES))
def test_live_check_passes_and_names_a_planted_bug(shared_root: Path, case: str) -> None:
    result, _ = launch(shared_root, case)
    clean, planted = result["clean"], result["planted"]
    asked = CASES[case][4].split(",")
    assert clean["verdict"] == "pass", [(o["name"], o["findings"][:2]) for o in clean["oracles"]]
    assert [o["name"] for o in clean["oracles"]] == asked
    assert all(o["checked"] > 0 for o in clean["oracles"])
    mapping = next(o for o in clean["oracles"] if o["name"] == "mapping")
    assert mapping["metrics"]["export"] == "shared (export tap)"  # rode on coverage's drain, no export of its own
    assert mapping["metrics"]["gathers"] == 0  # every shard matched the export: nothing rebuilt
    differential = next(o for o in clean["oracles"] if o["name"] == "differential")
    assert differential["metrics"]["real"] == "shared (coverage export)"
    assert planted["verdict"] == "fail"
    failed = {o["name"]: o["findings"] for o in planted["oracles"] if o["verdict"] != "pass"}
    assert sorted(failed) == ["mapping"]  # the bug is in the export's math: the probe makes it too
    findings = {f["tensor"]: f for f in failed["mapping"]}
    assert sorted(findings) == sorted([*QK_BUG, QKV])
    shard_ranks = [f["detail"]["rank"] for f in failed["mapping"] if f["tensor"] == QKV]
    assert shard_ranks == QKV_RANKS.get(case, [0])  # every replica that holds head 0 is named
    q = findings["model.layers.0.self_attn.q_proj.weight"]
    assert q["kind"] == "export-bytes-differ"
    assert f"explicit mapping of {QKV} (rebuilt from the shards)" in q["message"]
    assert "256/1024 elements differ; first at index [0, 0]" in q["message"]
    assert q["detail"]["megatron"] == QKV and q["detail"]["first_index"] == [0, 0]
    shard = next(f for f in failed["mapping"] if f["tensor"] == QKV)  # head 0 lives on TP rank 0 (of each replica)
    assert shard["kind"] == "shard-bytes-differ" and shard["detail"]["rank"] == 0
    assert (
        f"to_shard of the export: {QKV_SHARD[CASES[case][1]]} elements differ; first at index [0, 0]"
        in shard["message"]
    )
    assert result["weights_unchanged"] == [True, True]  # digest of every rank's weights before and after each check
    assert result["nothing_left_patched"]
    assert set(result["cyclic_leftovers"]) == {0}  # no cycle of convcheck's or the bridge's objects on any rank
    assert result["wrapped_as"] == ["DistributedDataParallel(Float16Module(GPTModel))"]  # as the trainer holds them
    assert (
        clean["layout"]["pp"] == CASES[case][3]
        and clean["layout"]["world_size"] == math.lcm(*CASES[case][1:3]) * CASES[case][3] * DP.get(case, 1)
        and clean["layout"].get("dp", 1) == DP.get(case, 1)
    )


@pytest.mark.ranks
def test_a_virtual_pipeline_numbered_from_chunk_0_is_named_live(shared_root: Path) -> None:
    """PP2 x VPP2: the bridge planted to number every chunk's layers from chunk 0's offset (after the clean and planted
    checks of the same job, whose global names are kept per process): each stage's second chunk is named holding
    another chunk's layers, its names claimed twice, and layers 2 and 3 never exported."""
    result, _ = launch(shared_root, "qwen3-moe-pp2vpp2")
    assert result["clean"]["verdict"] == "pass" and result["clean"]["layout"]["vpp"] == 2
    report = result["misnumbered"]
    assert report["verdict"] == "fail" and [o["name"] for o in report["oracles"]] == ["coverage"]
    findings = report["oracles"][0]["findings"]
    placed = [f["message"] for f in findings if f["kind"] == "misplaced-layers"]
    assert placed == [
        "PP stage 0 chunk 1 (rank 0) holds decoder layers [0]; PP2xVPP2 puts layers [2] there",
        "PP stage 1 chunk 1 (rank 1) holds decoder layers [1]; PP2xVPP2 puts layers [3] there",
    ]
    twice = {(f["tensor"], f["detail"]["rank"]) for f in findings if f["kind"] == "claimed-twice"}
    assert ("decoder.layers.0.self_attention.linear_qkv.weight", 0) in twice
    assert ("decoder.layers.1.mlp.experts.local_experts.7.linear_fc2.weight", 1) in twice
    missing = {f["tensor"] for f in findings if f["kind"] == "not-exported"}
    assert {"model.layers.2.self_attn.q_proj.weight", "model.layers.3.mlp.experts.7.down_proj.weight"} <= missing
    assert not any(n.startswith(("model.layers.0.", "model.layers.1.")) for n in missing)


@pytest.mark.ranks
def test_an_uneven_pipeline_numbered_as_even_is_named_live(shared_root: Path) -> None:
    """PP2 with 1 and 3 decoder layers (a tied-embedding Qwen2 whose last stage holds its own copy of the embedding):
    clean passes; with the bridge planted to number stage 1's layers as if the split were even (offset 2 instead of
    1), coverage names stage 1 holding layers [2, 3, 4], layer 4 mapped to names the model does not have, every
    tensor of layer 1 never exported, and the export that then raises."""
    result, _ = launch(shared_root, "qwen2-tied-4l-pp2first1last3")
    assert result["clean"]["verdict"] == "pass"
    assert (result["clean"]["layout"]["pp_first"], result["clean"]["layout"]["pp_last"]) == (1, 3)
    report = result["misnumbered"]
    assert report["verdict"] == "fail" and [o["name"] for o in report["oracles"]] == ["coverage"]
    findings = report["oracles"][0]["findings"]
    assert [f["message"] for f in findings if f["kind"] == "misplaced-layers"] == [
        "PP stage 1 chunk 0 (rank 1) holds decoder layers [2, 3, 4]; PP2xFIRST1xLAST3 puts layers [1, 2, 3] there"
    ]
    kinds = {f["kind"] for f in findings}
    assert kinds == {"misplaced-layers", "hf-missing", "not-exported", "export-failed"}, kinds
    missing = {f["tensor"] for f in findings if f["kind"] == "not-exported"}
    assert len(missing) == 12 and all(n.startswith("model.layers.1.") for n in missing)
    unmapped = {f["tensor"] for f in findings if f["kind"] == "hf-missing"}
    assert len(unmapped) == 7 and all(n.startswith("decoder.layers.4.") for n in unmapped)


REFUSED = (
    "live: pg_collection.tp holds ranks [0, 1] on rank 0, parallel_state's tp group [0]; the pinned megatron-bridge's "
    "export reads parallel_state, so a collection that disagrees with it is refused; on every rank (rank 0's shown)"
)
SENDER_RAISED = (
    "sender tests.live_trainer:raises_on_rank1 raised ConnectionError: weight channel to the rollout closed "
    "(after 3 item(s)); on rank 1 only"
)


@pytest.mark.ranks
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_raise_on_some_ranks_ends_every_rank_alike(shared_root: Path, case: str) -> None:
    """No hang, the same error everywhere: a user's sender (a function object) raising on rank 1 only is rank 0's
    `sender-failed` finding (rank 1 drained the rest of the bridge's export, so the collectives matched); the
    coverage oracle raising in rank 0's report alone is the same LiveFailure on every rank; a collection whose TP
    group disagrees with parallel_state is the same BadInput on every rank."""
    result, _ = launch(shared_root, case)
    report = result["one_rank"]["sender"]
    assert report["verdict"] == "fail"
    failed = {o["name"]: [(f["tensor"], f["kind"], f["message"]) for f in o["findings"]] for o in report["oracles"]
              if o["verdict"] != "pass"}  # fmt: skip
    assert failed == {name: [("<sender>", "sender-failed", SENDER_RAISED)] for name in ("coverage", "mapping")}
    assert next(o for o in report["oracles"] if o["name"] == "differential")["verdict"] == "pass"
    first, *others = result["one_rank"]["oracle"]
    assert all(other == first for other in others) and len(others) + 1 == result["clean"]["layout"]["world_size"]
    assert re.fullmatch(
        r"live: oracle coverage raised RuntimeError: planted: rank 0's report raised at \S+/tests/live_trainer\.py:\d+ "
        r"<- \S+/convcheck/oracles/coverage\.py:\d+ <- \S+/convcheck/live/check\.py:\d+; on rank 0 only",
        first,
    ), first
    refused = result["one_rank"]["refused"]
    if CASES[case][3] == 1:
        assert refused == [None] * len(refused)  # no collection passed in this case
        return
    assert refused == [REFUSED] * 2


@pytest.mark.ranks
@pytest.mark.parametrize("case", ["qwen3-pp2", "qwen3-tp2"])
def test_live_digest_matches_the_saved_export(shared_root: Path, case: str) -> None:
    """live.digest of the trained weights (with the job's collection in the PP2 case) equals what `convcheck sweep`
    reads from the bridge's saved export of the same weights, and differs from the untrained fixture."""
    result, folder = launch(shared_root, case)
    manifest = json.loads((folder / "live.digest.json").read_text())
    assert manifest["format"] == "convcheck-digest/1" and len(manifest["tensors"]) == result["digest_tensors"] == 25
    same = run_cli("sweep", str(folder / "export"), str(folder / "live.digest.json"))
    assert same.code == 0 and "identical; 25 tensors in both" in same.out, same.out + same.err
    trained = run_cli("sweep", resolve_model("tiny:qwen3"), str(folder / "live.digest.json"))
    assert trained.code == 1 and "model.embed_tokens.weight" in trained.out, trained.out


def test_source_needing_oracle_is_refused_before_anything() -> None:
    import convcheck.live

    with pytest.raises(BadInput, match=r"^oracle roundtrip, logits needs an HF source .*; live: coverage, "):
        convcheck.live.check(None, None, oracles="coverage,roundtrip,logits")
    with pytest.raises(BadInput, match=r"^unknown oracle nope"):
        convcheck.live.check(None, None, oracles=["nope"])
    with pytest.raises(BadInput, match=r"^sender 'no_such_module:f': cannot import no_such_module"):
        convcheck.live.check(None, None, sender="no_such_module:f")


def test_live_table_is_generated_from_the_modules() -> None:
    import re

    from convcheck.oracles import live_markdown

    text = (ROOT / "docs" / "live.md").read_text()
    match = re.search(r"<!-- live:begin[^\n]*-->\n(.*?)<!-- live:end -->", text, re.DOTALL)
    assert match, "docs/live.md lost its live:begin / live:end markers"
    assert match.group(1) == live_markdown(), "paste convcheck.oracles.live_markdown() into docs/live.md"


@pytest.mark.ranks
def test_live_sync_path_bugs_are_named(shared_root: Path) -> None:
    """In the same job: a sender that flips one bit of k_proj is named by the live receiver check (against the bridge's
    own export), a receiver that transposes o_proj on reload by idempotence."""
    result, _ = launch(shared_root, "qwen3-tp2")
    planted = {o["name"]: o for o in result["sync_planted"]["oracles"]}
    assert planted["receiver"]["verdict"] == "fail" and planted["idempotence"]["verdict"] == "fail"
    (flipped,) = planted["receiver"]["findings"]
    assert (flipped["tensor"], flipped["kind"], flipped["detail"]["first_index"]) == (
        "model.layers.0.self_attn.qkv_proj.weight", "bytes-differ", [32, 5]
    )  # fmt: skip
    assert "<- model.layers.0.self_attn.k_proj.weight[0, 5]" in flipped["message"]
    transposed = {f["tensor"]: f for f in planted["idempotence"]["findings"]}
    assert sorted(transposed) == [f"model.layers.{i}.self_attn.o_proj.weight" for i in (0, 1)]
    assert all("transposed by the replay" in f["message"] for f in transposed.values())


def test_names_folder_gives_names_never_bytes() -> None:
    """The live run's checkpoint keeps the header's names, shapes and dtypes; any read of a value fails loudly."""
    from convcheck.hf.checkpoint import open_checkpoint
    from convcheck.hf.tensors import TensorReader
    from convcheck.live.context import NO_BYTES, names_only

    folder = resolve_model("tiny:qwen3")
    names, source = names_only(Path(folder)), open_checkpoint(folder)
    assert {n: (e.shape, e.dtype) for n, e in names.tensors.items()} == {
        n: (e.shape, e.dtype) for n, e in source.tensors.items()
    }
    assert {e.file for e in names.tensors.values()} == {NO_BYTES}
    with pytest.raises(Exception, match="names only"):
        TensorReader(names).get("model.norm.weight")


def test_names_are_read_once_per_folder_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer checking every K steps: the folder is checked and parsed once while its bytes stay the same; an
    edited config or header (same names, other shape), a truncated shard or another folder is read again."""
    import shutil

    from convcheck.live import context

    folder = tmp_path / "ckpt"
    shutil.copytree(resolve_model("tiny:qwen3"), folder)
    opened: list[Path] = []
    real_open = context.open_checkpoint
    monkeypatch.setattr(context, "open_checkpoint", lambda f: opened.append(f) or real_open(f))
    first = context.names_only(folder)
    first.config["edited_by_the_caller"] = 1  # what a caller does to its copy stays with it
    again = context.names_only(folder)
    assert len(opened) == 1 and again.tensors == first.tensors and "edited_by_the_caller" not in again.config
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    assert context.names_only(folder).config["rms_norm_eps"] == 1e-5 and len(opened) == 2
    shard = next(folder.glob("*.safetensors"))
    with open(shard, "r+b") as fh:
        fh.truncate(shard.stat().st_size - 2)
    with pytest.raises(BadInput, match=r"^truncated safetensors file .*: tensor '.*' ends at data byte \d+, past"):
        context.names_only(folder)
    assert len(opened) == 3


def test_agreed_line_names_the_ranks_that_failed() -> None:
    """What every rank reports after the agreement: unchanged when all failed alike, else rank-qualified."""
    from convcheck.sync.agree import agreed

    assert agreed([None, None]) is None
    assert agreed(["E: x", "E: x"]) == "E: x"
    assert agreed([None, "E: x"]) == "E: x; on rank 1 only"
    assert agreed([None, "E: x", None, "E: y"]) == "E: x; on ranks 1, 3 only"
    assert agreed(["E: a", "E: b"]) == "E: a; on every rank (rank 0's shown)"


def test_sender_and_receiver_objects_are_accepted_and_named() -> None:
    """live's sender= / receiver= take the function / class itself, checked as a spec is and named module:qualname."""
    from convcheck.mutants.sync import TransposeOnReloadReceiver, flip_bit
    from convcheck.sync.adapters import check_adapters, label, load_receiver, load_sender

    check_adapters(flip_bit, TransposeOnReloadReceiver, 64.0)
    assert load_sender(flip_bit) is flip_bit and load_receiver(TransposeOnReloadReceiver) is TransposeOnReloadReceiver
    assert label(flip_bit) == "convcheck.mutants.sync:flip_bit" and label("bucketed") == "bucketed"
    with pytest.raises(BadInput, match=r"^receiver 'builtins:dict' has no load_weights\(weights\) method$"):
        check_adapters(None, dict, 64.0)
    with pytest.raises(BadInput, match=r"^sender 'builtins:int' is not callable$"):
        check_adapters(3, None, 64.0)


def test_a_job_with_replicas_reports_its_data_parallel_size() -> None:
    from types import SimpleNamespace

    from convcheck.cli.render import _layout_label
    from convcheck.layout import ParallelLayout
    from convcheck.live.check import job_layout

    tp2 = ParallelLayout(tp=2)
    assert job_layout(SimpleNamespace(layout=tp2, world=2)) == {"tp": 2, "pp": 1, "ep": 1, "etp": 1, "world_size": 2}
    replicas = job_layout(SimpleNamespace(layout=tp2, world=8))
    assert replicas["dp"] == 4 and replicas["world_size"] == 8 and _layout_label(replicas) == "TP2xDP4"
    assert ParallelLayout.from_dict(replicas) == tp2


@pytest.mark.ranks
def test_live_mapping_reads_again_what_the_differential_did_not_prove(shared_root: Path) -> None:
    """Layer 1's experts exported with gate and up swapped after the EP gather (tests/live_trainer.py, on top of the
    q/k plant): the probe makes the same swap, so the differential passes and notes the swapped byte ranges as proved;
    the mapping tap's compares of the ranges the explicit mapping wants are not among them and still name every
    expert, on the rank that holds it."""
    result, _ = launch(shared_root, "qwen3-moe-tp2ep2")
    clean = next(o for o in result["clean"]["oracles"] if o["name"] == "mapping")
    planted = result["experts_planted"]
    assert planted["verdict"] == "fail"
    failed = {o["name"]: o for o in planted["oracles"] if o["verdict"] != "pass"}
    assert sorted(failed) == ["mapping"]
    mapping = failed["mapping"]
    found = {
        (f["tensor"], f["kind"], f["detail"].get("rank"), tuple(f["detail"]["first_index"]))
        for f in mapping["findings"]
    }
    experts = {
        part
        for e in range(8)
        for part in (
            (f"decoder.layers.1.mlp.experts.local_experts.{e}.linear_fc1.weight", "shard-bytes-differ", e // 4, (0, 0)),
            (f"model.layers.1.mlp.experts.{e}.gate_proj.weight", "export-bytes-differ", None, (0, 0)),
            (f"model.layers.1.mlp.experts.{e}.up_proj.weight", "export-bytes-differ", None, (0, 0)),
        )
    }
    qk = {(QKV, "shard-bytes-differ", 0, (0, 0))} | {(n, "export-bytes-differ", None, (0, 0)) for n in QK_BUG}
    assert found == experts | qk
    # rank 0's compares the differential had proved: every one the clean check had, but its four layer-1 experts'
    # gate and up rows (proved at the swapped places, looked up at the right ones)
    assert clean["metrics"]["compares_proven_by_differential"] > 8
    assert (
        mapping["metrics"]["compares_proven_by_differential"] == clean["metrics"]["compares_proven_by_differential"] - 8
    )
