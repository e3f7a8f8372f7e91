"""Weight-sync oracles on real ranks: the built-in paths pass; every planted sync bug fails naming the tensor."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from convcheck.api import prepare, run_in_ranks
from convcheck.errors import BadInput
from convcheck.mutants.sync import FLIPPED, TRUNCATED
from convcheck.oracles import DEFAULT_ORACLES, ORACLES, parse_oracle_names
from tests.support.helpers import ROOT, mutant, run_cli

SYNC_ORACLES = ("receiver", "idempotence", "delta", "broadcast")
EXAMPLE = ROOT / "examples" / "sync_adapters.py"


def _kinds(findings: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(f["tensor"], f["kind"]) for f in findings}


def _metrics(res: Any, oracle: str) -> dict[str, Any]:
    return next(o for o in res.report["oracles"] if o["name"] == oracle).get("metrics", {})


def test_the_sync_oracles_are_opt_in() -> None:
    assert DEFAULT_ORACLES == (
        "coverage",
        "roundtrip",
        "config",
        "logits",
        "differential",
        "elements",
        "layout",
        "mapping",
    )
    assert parse_oracle_names("") == DEFAULT_ORACLES
    assert parse_oracle_names("receiver,broadcast") == ("receiver", "broadcast")
    assert all(not ORACLES[name].default for name in SYNC_ORACLES)


def test_bad_sync_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A user's receiver is imported and checked in a child process before any rank starts."""
    user = tmp_path / "receivers.py"
    user.write_text("import torch\n\n\nclass NoLoadWeights(torch.nn.Module):\n    pass\n")
    spec = f"{user}:NoLoadWeights"
    res = run_cli("verify", "--model", "tiny:qwen3", "--oracle", "receiver", "--receiver", spec)
    assert res.code == 2 and "Traceback" not in res.err
    assert res.err.strip().splitlines() == [f"convcheck: error: receiver {spec!r} has no load_weights(weights) method"]
    res = run_cli("verify", "--model", "tiny:qwen3", "--sender", "no/such/file.py:send")
    assert res.code == 2 and res.err.count("\n") == 1 and "sender file not found: no/such/file.py" in res.err


def test_adapter_problems_are_found_before_any_rank_starts() -> None:
    with pytest.raises(BadInput, match="has no attribute 'no_such_sender'"):
        prepare("tiny:qwen3", "tp2", oracles="roundtrip", sender="convcheck.mutants.sync:no_such_sender")
    with pytest.raises(BadInput, match="the broadcast oracle needs at least 2 ranks"):
        prepare("tiny:qwen3", oracles="broadcast")
    with pytest.raises(BadInput, match="--sender broadcast needs at least 2 ranks"):
        prepare("tiny:qwen3", oracles="roundtrip", sender="broadcast")
    with pytest.raises(BadInput, match="--receiver is used only by the receiver and idempotence oracles"):
        prepare("tiny:qwen3", oracles="roundtrip", receiver="fused")
    job = prepare("tiny:qwen3", "tp2", oracles="receiver", sender="bridge", receiver="fused", chunk_mb=0.5)
    assert (job.sync.sender, job.sync.receiver, job.sync.chunk_mb) == (None, "fused", 0.5)


@pytest.mark.ranks
def test_fused_receiver_passes_every_sync_oracle(tmp_path: Path) -> None:
    res = run_cli(
        "verify",
        "--model",
        "tiny:qwen3",
        "--tp",
        "2",
        "--oracle",
        ",".join(SYNC_ORACLES),
        "--receiver",
        "fused",
        "--chunk-mb",
        "0.001",
        tmp_path=tmp_path,
    )
    assert res.code == 0, res.out + res.err
    assert res.verdicts() == dict.fromkeys(SYNC_ORACLES, "pass")
    sent = _metrics(res, "broadcast")
    assert sent["bytes"] == 56704 and sent["chunks"] > 25 and sent["GBps"] > 0  # 1 KiB chunks: most tensors split
    delta = _metrics(res, "delta")
    assert 1 <= delta["delta_tensors"] <= 6 and 0 < delta["delta_bytes"] < delta["full_bytes"] / 10


@pytest.mark.ranks
def test_bucketed_sender_into_fused_expert_stacks(tmp_path: Path) -> None:
    res = run_cli(
        "verify",
        "--model",
        "tiny:qwen3-moe",
        "--tp",
        "2",
        "--ep",
        "2",
        "--sender",
        "bucketed",
        "--chunk-mb",
        "0.004",
        "--receiver",
        "fused",
        "--oracle",
        "coverage,roundtrip,receiver,idempotence",
        tmp_path=tmp_path,
    )
    assert res.code == 0, res.out + res.err
    assert set(res.verdicts().values()) == {"pass"}
    receiver = next(o for o in res.report["oracles"] if o["name"] == "receiver")
    assert receiver["checked"] == 21  # 8 experts x (gate, up, down) x 2 layers packed into 2 w13 + 2 w2 stacks


@pytest.mark.ranks
def test_broadcast_sender_into_hf_receiver_with_tied_weights(tmp_path: Path) -> None:
    res = run_cli(
        "verify",
        "--model",
        "tiny:qwen2-tied",
        "--tp",
        "2",
        "--sender",
        "broadcast",
        "--chunk-mb",
        "0.002",
        "--receiver",
        "hf",
        "--oracle",
        "coverage,roundtrip,receiver,broadcast,delta",
        tmp_path=tmp_path,
    )
    assert res.code == 0, res.out + res.err
    assert set(res.verdicts().values()) == {"pass"}
    receiver = next(o for o in res.report["oracles"] if o["name"] == "receiver")
    assert receiver["checked"] == 27  # the 26 source tensors and lm_head.weight, tied to the embedding


@pytest.mark.ranks
def test_planted_sender_transport_and_delta_bugs_are_named(tmp_path: Path) -> None:
    """One launch, four plants in different places: a flipped bit in the sender's stream, a broadcast chunk cut short,
    a delta index off by one and an empty delta that is not a no-op; each oracle names its tensor."""
    hooks = [
        x
        for name in ("truncate_broadcast_chunk", "delta_index_off_by_one", "empty_delta_not_noop")
        for x in ("--hook", mutant("sync", name))
    ]
    res = run_cli(
        "verify", "--model", "tiny:qwen3", "--tp", "2", "--sender", mutant("sync", "flip_bit"), "--receiver", "fused",
        "--oracle", "roundtrip,receiver,broadcast,delta", *hooks, tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out + res.err
    (flipped,) = res.findings("roundtrip")
    assert (flipped["tensor"], flipped["kind"], flipped["detail"]["first_index"]) == (FLIPPED, "bytes-differ", [0, 5])
    (packed,) = res.findings("receiver")
    assert (packed["tensor"], packed["kind"]) == ("model.layers.0.self_attn.qkv_proj.weight", "bytes-differ")
    assert packed["detail"]["first_index"] == [32, 5] and f"<- {FLIPPED}[0, 5]" in packed["message"]

    # the receiving rank compares with the source: the sender's flipped bit shows too, beside the cut chunk
    assert _kinds(res.findings("broadcast")) == {(TRUNCATED, "truncated"), (FLIPPED, "bytes-differ")}
    truncated = next(f for f in res.findings("broadcast") if f["kind"] == "truncated")
    assert truncated["detail"]["received_bytes"] == truncated["detail"]["expected_bytes"] - 2

    # the planted update flips bits of lm_head.weight (among others); the delta's first entry is lm_head.weight
    assert _kinds(res.findings("delta")) == {
        ("lm_head.weight", "delta-mismatch"),
        ("lm_head.weight", "empty-delta-not-noop"),
    }
    mismatch = next(f for f in res.findings("delta") if f["kind"] == "delta-mismatch")
    assert mismatch["detail"]["count"] == 2  # the element it should patch and its neighbour it patched instead
    assert f"--sender {mutant('sync', 'flip_bit')} --receiver fused" in res.out
    assert f"--hook {mutant('sync', 'truncate_broadcast_chunk')}" in res.out


CASES: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "example": (
        f"{EXAMPLE}:layerwise_sender",
        f"{EXAMPLE}:DictReceiver",
        ("coverage", "roundtrip", "receiver", "idempotence"),
    ),
    "bucket_offset": (mutant("sync", "bucket_offset_off_by_one"), None, ("roundtrip",)),
    "duplicate_and_drop": (mutant("sync", "duplicate_and_drop"), "fused", ("coverage", "receiver")),
    "raises": (mutant("sync", "raises_midway"), None, ("roundtrip",)),
    "non_tensor": (mutant("sync", "yields_non_tensor"), None, ("coverage",)),
    "unknown_name": (mutant("sync", "yields_unknown_name"), None, ("coverage",)),
    "drop_v": (None, mutant("sync", "DropVReceiver"), ("receiver",)),
    "swap_gate_up": (None, mutant("sync", "SwapGateUpReceiver"), ("receiver",)),
    "transpose_on_reload": (None, mutant("sync", "TransposeOnReloadReceiver"), ("idempotence", "receiver")),
    "accumulate_on_reload": (None, mutant("sync", "AccumulateOnReloadReceiver"), ("idempotence",)),
}
"""case -> (sender, receiver, oracles): each runs in the same launch, one after the other."""


def sync_cases(ctx: Any) -> dict[str, dict[str, Any]]:
    """Every CASES entry run in the ranks of one loaded model (collective); rank 0 returns the verdicts."""
    from convcheck.oracles import load_oracle

    out: dict[str, dict[str, Any]] = {}
    for case, (sender, receiver, oracles) in CASES.items():
        ctx.sync = replace(ctx.sync, sender=sender, receiver=receiver)
        out[case] = {}
        for name in oracles:
            verdict = load_oracle(name)(ctx)
            if verdict is not None:
                out[case][name] = verdict.to_dict()
    return out


@pytest.mark.ranks
def test_planted_senders_and_receivers_are_named() -> None:
    out = run_in_ranks(f"{__file__}:sync_cases", "tiny:qwen3", "tp2")

    def kinds(case: str, oracle: str) -> set[tuple[str, str]]:
        return _kinds(out[case][oracle]["findings"])

    def message(case: str, oracle: str, kind: str) -> str:
        return next(f["message"] for f in out[case][oracle]["findings"] if f["kind"] == kind)

    assert {o: v["verdict"] for o, v in out["example"].items()} == dict.fromkeys(CASES["example"][2], "pass")
    assert kinds("bucket_offset", "roundtrip") == {("model.embed_tokens.weight", "bytes-differ")}

    cov = kinds("duplicate_and_drop", "coverage")
    dropped = {t for t, k in cov if k == "not-exported"}
    assert ("model.norm.weight", "duplicate") in cov and len(dropped) == 1 and len(cov) == 2
    rec = kinds("duplicate_and_drop", "receiver")
    assert {("model.norm.weight", "delivered-twice"), (dropped.pop(), "not-delivered")} <= rec

    assert ("<sender>", "sender-failed") in kinds("raises", "roundtrip")
    text = message("raises", "roundtrip", "sender-failed")
    assert "convcheck.mutants.sync:raises_midway raised ConnectionError: weight channel closed by peer" in text
    assert "(after 3 item(s))" in text
    assert kinds("non_tensor", "coverage") == {
        ("<sender>", "sender-bad-item"),
        ("model.embed_tokens.weight", "not-exported"),
    }
    assert "'model.embed_tokens.weight': list instead of a tensor" in message(
        "non_tensor", "coverage", "sender-bad-item"
    )
    assert kinds("unknown_name", "coverage") == {("<sender>", "sender-bad-item")}
    text = message("unknown_name", "coverage", "sender-bad-item")
    assert "yields_unknown_name yielded 1 bad item(s)" in text and "model.layers.0.self_attn.qkv.weight" in text

    qkv = {f"model.layers.{i}.self_attn.qkv_proj.weight" for i in (0, 1)}
    assert kinds("drop_v", "receiver") == {(q, "not-written") for q in qkv}
    assert "<- model.layers.0.self_attn.v_proj.weight[0, 0]" in message("drop_v", "receiver", "not-written")
    gate_up = {f"model.layers.{i}.mlp.gate_up_proj.weight" for i in (0, 1)}
    assert kinds("swap_gate_up", "receiver") == {(g, "bytes-differ") for g in gate_up}
    assert "<- model.layers.0.mlp.gate_proj.weight[0, 0]" in message("swap_gate_up", "receiver", "bytes-differ")

    o_proj = {f"model.layers.{i}.self_attn.o_proj.weight" for i in (0, 1)}
    assert out["transpose_on_reload"]["receiver"]["verdict"] == "pass"  # one sync is right: only a replay breaks it
    assert kinds("transpose_on_reload", "idempotence") == {(o, "not-idempotent") for o in o_proj}
    assert "transposed by the replay" in message("transpose_on_reload", "idempotence", "not-idempotent")
    norms = kinds("accumulate_on_reload", "idempotence")
    assert ("model.norm.weight", "not-idempotent") in norms and len(norms) == 9  # 4 norms per layer + the final one
    assert "accumulated" in message("accumulate_on_reload", "idempotence", "not-idempotent")


def test_truncate_plant_bites_on_moe_names_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broadcast plant cuts the first up_proj it sees, an expert's on a MoE (on NCCL it once hit nothing)."""
    import torch

    from convcheck.mutants.sync import truncate_broadcast_chunk
    from convcheck.sync import transport

    monkeypatch.setattr(transport, "payload", transport.payload)  # restored after the test
    truncate_broadcast_chunk()
    t = torch.arange(8, dtype=torch.int16)
    sizes = [
        transport.payload(n, t).numel()
        for n in (
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.mlp.experts.3.up_proj.weight",
            "model.layers.0.mlp.experts.4.up_proj.weight",
            "model.layers.0.mlp.experts.3.up_proj.weight",
        )
    ]
    assert sizes == [16, 14, 16, 14]
