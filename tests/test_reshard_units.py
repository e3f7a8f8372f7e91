"""Reshard planner, executor and reference on index-coded tensors in one process (no ranks, no bridge).

The trainer shards are built here from HF-layout tensors by the test's own Megatron layout code, so the planner
(which reads Megatron's layout) and the reference (which reads HF's) meet only in the comparison.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from convcheck.compare.bits import compare_bits
from convcheck.errors import BadInput
from convcheck.reshard.execute import execute
from convcheck.reshard.plan import build_plan, coverage, spans
from convcheck.reshard.roles import ParamRole, Shard, role_mismatch
from convcheck.reshard.target import TargetLayout, reference_shard

NH, NKV, D, H, FFN, V = 4, 2, 3, 5, 8, 10


def _hf() -> dict[str, torch.Tensor]:
    sizes = {"q": (NH * D, H), "k": (NKV * D, H), "v": (NKV * D, H), "gate": (FFN, H), "up": (FFN, H)}
    sizes |= {"emb": (V, H), "o": (H, NH * D), "norm": (H,)}
    out, start = {}, 0
    for name, shape in sizes.items():
        n = torch.Size(shape).numel()
        out[name] = torch.arange(start, start + n, dtype=torch.float32).reshape(shape)
        start += n
    return out


def _megatron_full(hf: dict[str, torch.Tensor], kind: str) -> torch.Tensor:
    """Megatron's unsharded layout: qkv interleaved per group; fc1 is per-shard [gate; up] (built in _trainer)."""
    if kind == "qkv":
        per = NH // NKV
        rows = []
        for g in range(NKV):
            rows += [hf["q"][(g * per + j) * D : (g * per + j + 1) * D] for j in range(per)]
            rows += [hf["k"][g * D : (g + 1) * D], hf["v"][g * D : (g + 1) * D]]
        return torch.cat(rows)
    return {"column": hf["emb"], "row": hf["o"], "replicated": hf["norm"]}[kind]


ROLES = {
    "qkv": ParamRole(
        name="qkv", kind="qkv", core_split="column", hf=("q", "k", "v"), hf_shapes=((12, 5), (6, 5), (6, 5)),
        expert=None, heads=(NH, NKV, D),
    ),
    "fc1": ParamRole(name="fc1", kind="gated", core_split="column", hf=("gate", "up"), hf_shapes=((8, 5), (8, 5)),
                     expert=None),
    "emb": ParamRole(name="emb", kind="column", core_split="column", hf=("emb",), hf_shapes=((V, H),), expert=None),
    "o": ParamRole(name="o", kind="row", core_split="row", hf=("o",), hf_shapes=((H, NH * D),), expert=None),
    "norm": ParamRole(name="norm", kind="replicated", core_split="replicated", hf=("norm",), hf_shapes=((H,),),
                      expert=None),
}  # fmt: skip


def _trainer(tp: int) -> tuple[dict[str, list[Shard]], dict[str, torch.Tensor]]:
    """Trainer shards at `tp`, all held by rank 0 under distinct keys (so the executor runs without a group)."""
    hf = _hf()
    shards, tensors = {}, {}
    for name, role in ROLES.items():
        for i in range(1 if role.kind == "replicated" else tp):
            if role.kind == "gated":
                n = FFN // tp
                part = torch.cat([hf["gate"][i * n : (i + 1) * n], hf["up"][i * n : (i + 1) * n]])
            elif role.kind == "replicated":
                part = hf["norm"]
            else:
                dim = 1 if role.kind == "row" else 0
                full = _megatron_full(hf, role.kind)
                n = -(-full.shape[dim] // tp)
                part = torch.zeros(*(n if d == dim else s for d, s in enumerate(full.shape)))
                got = full.narrow(dim, i * n, max(0, min(n, full.shape[dim] - i * n)))
                part.narrow(dim, 0, got.shape[dim]).copy_(got)
            key = f"{name}@{i}"
            tensors[key] = part.contiguous()
            shards.setdefault(name, []).append(
                Shard(rank=0, local=key, index=i, count=tp, shape=tuple(part.shape), dtype="float32")
            )
    return shards, tensors


@pytest.mark.parametrize("trainer_tp", [1, 2])
@pytest.mark.parametrize("target_tp", [1, 2, 4])
def test_assembled_equals_reference(trainer_tp: int, target_tp: int) -> None:
    shards, tensors = _trainer(trainer_tp)
    layout = TargetLayout(tp=target_tp)
    plans, findings = build_plan(ROLES, shards, layout, world=1)
    assert findings == []
    assert [coverage(p, shards) for p in plans] == [None] * len(plans)
    assembled, moved = execute(plans, tensors, rank=0, world=1)
    hf = _hf()
    assert sorted(assembled) == sorted((t, n) for t in range(target_tp) for n in ROLES)
    for (target, name), got in assembled.items():
        want = reference_shard(ROLES[name], [hf[h] for h in ROLES[name].hf], layout, target)
        assert compare_bits(name, want, got) is None, (name, target)
    for m in moved.values():
        assert m.moved_bytes + m.padding_bytes == m.shard_bytes


def test_kv_heads_replicate_when_fewer_than_target_tp() -> None:
    """At TP4 with 2 kv heads, ranks 0,1 hold kv head 0 and ranks 2,3 kv head 1 (the q heads' own groups)."""
    hf = _hf()
    layout = TargetLayout(tp=4)
    k_rows = [reference_shard(ROLES["qkv"], [hf["q"], hf["k"], hf["v"]], layout, r)[D : 2 * D] for r in range(4)]
    for r in range(4):
        assert torch.equal(k_rows[r].view(torch.int32), hf["k"][(r // 2) * D : (r // 2 + 1) * D].view(torch.int32))


def test_emb_padding_rows_are_zero_and_not_moved() -> None:
    """10 vocab rows at TP4: 3 rows per rank, the last rank holds one real row and two zero rows."""
    shards, tensors = _trainer(2)
    layout = TargetLayout(tp=4)
    plans, _ = build_plan({"emb": ROLES["emb"]}, {"emb": shards["emb"]}, layout, world=1)
    assembled, moved = execute(plans, tensors, rank=0, world=1)
    assert torch.equal(assembled[(3, "emb")][1:].view(torch.int32), torch.zeros(2, H).view(torch.int32))
    assert moved[3].padding_bytes == 2 * H * 4 and moved[3].moved_bytes == H * 4


def test_dropped_piece_is_a_coverage_finding() -> None:
    shards, _ = _trainer(2)
    plans, _ = build_plan({"o": ROLES["o"]}, {"o": shards["o"]}, TargetLayout(tp=1), world=1)
    broken = replace(plans[0], pieces=plans[0].pieces[:-1])
    finding = coverage(broken, shards)
    assert finding is not None and finding.kind == "plan-coverage"
    assert (
        finding.message
        == "target rank 0: 30 element(s) not covered exactly once; first at index [0, 6], covered 0 time(s)"
    )


def test_missing_shard_is_a_finding_not_a_default() -> None:
    shards, _ = _trainer(2)
    _, findings = build_plan({"o": ROLES["o"]}, {"o": shards["o"][:1]}, TargetLayout(tp=1), world=1)
    assert [(f.tensor, f.kind) for f in findings] == [("o", "no-source")]


def test_role_mismatch_names_both_sides() -> None:
    wrong = replace(ROLES["o"], kind="replicated")
    finding = role_mismatch(wrong)
    assert finding is not None and finding.tensor == "o" and finding.detail == {"bridge": "replicated", "core": "row"}
    assert role_mismatch(ROLES["qkv"]) is None


def test_spans_cut_at_block_edges() -> None:
    assert spans(2, 9, 4) == [(0, 2, 4), (1, 0, 4), (2, 0, 1)]


def test_target_layout_validates() -> None:
    with pytest.raises(BadInput):
        TargetLayout(tp=0)
    with pytest.raises(BadInput):
        TargetLayout(ep=3, num_experts=8)
    layout = TargetLayout(tp=2, ep=4, num_experts=8)
    assert layout.world == 4 and [layout.holds(r, 5) for r in range(4)] == [False, False, True, False]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_tp": 2}, "--target-tp / --target-ep / --target-etp are used only by the reshard oracle"),
        ({"oracles": "reshard", "target_etp": 2}, "--target-etp 2 must divide the expert MLP width"),
        ({"oracles": "reshard", "target_ep": [1, 0]}, "--target-ep must be a positive integer, got 0"),
        ({"oracles": "reshard", "target_tp": 3}, "--target-tp 3 must divide the 4 heads"),
        ({"oracles": "reshard", "target_ep": 2}, "--target-ep must be a positive integer dividing the 0 experts"),
    ],
)
def test_bad_targets_are_bad_input(kwargs: dict, message: str) -> None:
    from convcheck.api import prepare

    with pytest.raises(BadInput, match=message):
        prepare("tiny:qwen3", "tp1", device="cpu", **kwargs)


def test_targets_reach_the_job() -> None:
    from convcheck.api import prepare

    job = prepare(
        "tiny:qwen3-moe", "tp2etp2", oracles="reshard", device="cpu", target_tp=[4, 1, 4], target_ep=[2, 1],
        target_etp=2,
    )  # fmt: skip
    spec = job.rank_spec()
    assert (job.targets.tps, job.targets.eps, job.targets.etps) == ((4, 1), (2, 1), (2,))
    assert spec.targets == job.targets


@pytest.mark.parametrize("trainer_tp", [1, 2])
@pytest.mark.parametrize("target_tp", [1, 2, 4])
def test_qkv_bias_rows(trainer_tp: int, target_tp: int) -> None:
    """A 1-D fused qkv bias (qwen2) follows the same head rows as the weight."""
    hf = {k: v[:, 0].contiguous() for k, v in _hf().items() if k in "qkv"}
    role = replace(ROLES["qkv"], name="bias", hf_shapes=((NH * D,), (NKV * D,), (NKV * D,)))
    full = _megatron_full(hf, "qkv")
    n = full.shape[0] // trainer_tp
    tensors = {f"b@{i}": full[i * n : (i + 1) * n].clone() for i in range(trainer_tp)}
    shards = {"bias": [Shard(rank=0, local=f"b@{i}", index=i, count=trainer_tp, shape=(n,), dtype="float32")
                       for i in range(trainer_tp)]}  # fmt: skip
    layout = TargetLayout(tp=target_tp)
    plans, findings = build_plan({"bias": role}, shards, layout, world=1)
    assembled, _ = execute(plans, tensors, rank=0, world=1)
    for (target, _name), got in assembled.items():
        assert compare_bits("bias", reference_shard(role, [hf["q"], hf["k"], hf["v"]], layout, target), got) is None
    assert findings == [] and len(assembled) == target_tp


EXPERTS, EFFN = 2, 8


def _expert_hf() -> dict[str, torch.Tensor]:
    """Index-coded HF expert tensors: gate/up [EFFN, H] and down [H, EFFN] per expert."""
    out, start = {}, 10_000
    for e in range(EXPERTS):
        for name, shape in ((f"gate{e}", (EFFN, H)), (f"up{e}", (EFFN, H)), (f"down{e}", (H, EFFN))):
            out[name] = torch.arange(start, start + EFFN * H, dtype=torch.float32).reshape(shape)
            start += EFFN * H
    return out


def _expert_roles() -> dict[str, ParamRole]:
    roles = {}
    for e in range(EXPERTS):
        roles[f"e{e}.fc1"] = ParamRole(name=f"e{e}.fc1", kind="gated", core_split="column", hf=(f"gate{e}", f"up{e}"),
                                       hf_shapes=((EFFN, H), (EFFN, H)), expert=e)  # fmt: skip
        roles[f"e{e}.fc2"] = ParamRole(name=f"e{e}.fc2", kind="row", core_split="row", hf=(f"down{e}",),
                                       hf_shapes=((H, EFFN),), expert=e)  # fmt: skip
    return roles


def _expert_trainer(etp: int) -> tuple[dict[str, list[Shard]], dict[str, torch.Tensor]]:
    """Trainer expert shards at expert TP `etp` (fc1 per shard [gate shard; up shard], fc2 column blocks), rank 0."""
    hf = _expert_hf()
    shards, tensors = {}, {}
    n = EFFN // etp
    for name, role in _expert_roles().items():
        for i in range(etp):
            if role.kind == "gated":
                gate, up = (hf[h] for h in role.hf)
                part = torch.cat([gate[i * n : (i + 1) * n], up[i * n : (i + 1) * n]])
            else:
                part = hf[role.hf[0]][:, i * n : (i + 1) * n].contiguous()
            tensors[f"{name}@{i}"] = part
            shards.setdefault(name, []).append(
                Shard(rank=0, local=f"{name}@{i}", index=i, count=etp, shape=tuple(part.shape), dtype="float32")
            )
    return shards, tensors


@pytest.mark.parametrize("trainer_etp", [1, 2, 4])
@pytest.mark.parametrize(("target_ep", "target_etp"), [(1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (2, 4)])
def test_experts_between_expert_tp_sizes(trainer_etp: int, target_ep: int, target_etp: int) -> None:
    """Trainer ETP 1/2/4 -> target EP x ETP: each target rank of the owning EP rank assembles [gate; up] rows and
    down columns of its etp rank, bitwise the reference, moving exactly its shard's bytes."""
    roles, hf = _expert_roles(), _expert_hf()
    shards, tensors = _expert_trainer(trainer_etp)
    layout = TargetLayout(tp=2, ep=target_ep, etp=target_etp, num_experts=EXPERTS)
    plans, findings = build_plan(roles, shards, layout, world=1)
    assert findings == [] and [coverage(p, shards) for p in plans] == [None] * len(plans)
    assembled, moved = execute(plans, tensors, rank=0, world=1)
    want = {(t, n) for t in range(layout.world) for n, r in roles.items() if layout.holds(t, r.expert)}
    assert set(assembled) == want and len(want) == 4 * layout.world // target_ep
    for (target, name), got in assembled.items():
        expected = reference_shard(roles[name], [hf[h] for h in roles[name].hf], layout, target)
        assert compare_bits(name, expected, got) is None, (name, target)
    assert all(m.moved_bytes == m.shard_bytes for m in moved.values())


def test_target_expert_grid_is_expert_tp_innermost() -> None:
    """EP2 x ETP2 over 4 target ranks: ranks 0, 1 hold experts 0-3 (etp 0, 1), ranks 2, 3 experts 4-7."""
    layout = TargetLayout(tp=2, ep=2, etp=2, num_experts=8)
    assert [layout.expert_coord(r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [layout.holds(r, 7) for r in range(4)] == [False, False, True, True]
    assert (layout.world, layout.label, layout.split(3, 7), layout.split(3, None)) == (4, "tp2ep2etp2", (1, 2), (1, 2))
    with pytest.raises(BadInput):
        TargetLayout(etp=2)


def test_expert_gated_reference_packs_gate_then_up_per_etp_rank() -> None:
    """Target ETP2 rank 1 of expert 0: [gate rows 4..7; up rows 4..7] (vLLM's w13 under TP), down columns 4..7."""
    roles, hf = _expert_roles(), _expert_hf()
    layout = TargetLayout(ep=1, etp=2, num_experts=EXPERTS)
    fc1 = reference_shard(roles["e0.fc1"], [hf["gate0"], hf["up0"]], layout, 1)
    fc2 = reference_shard(roles["e0.fc2"], [hf["down0"]], layout, 1)
    assert torch.equal(fc1.view(torch.int32), torch.cat([hf["gate0"][4:], hf["up0"][4:]]).view(torch.int32))
    assert torch.equal(fc2.view(torch.int32), hf["down0"][:, 4:].contiguous().view(torch.int32))


def test_misplaced_expert_is_a_placement_finding() -> None:
    """Plans for expert 1 on target rank 0 (EP2: rank 1 owns it) name both ranks; a correct placement is silent."""
    from convcheck.oracles.reshard import placement_findings

    roles, layout = _expert_roles(), TargetLayout(tp=2, ep=2, num_experts=EXPERTS)
    shards, _ = _expert_trainer(1)
    plans, _ = build_plan(roles, shards, layout, world=1)
    assert placement_findings(plans, roles, layout, set()) == []
    moved = [replace(p, target=0) if p.name == "e1.fc2" else p for p in plans]
    (finding,) = placement_findings(moved, roles, layout, set())
    assert (finding.tensor, finding.kind, finding.detail["extra"], finding.detail["missing"]) == (
        "e1.fc2",
        "plan-placement",
        [0],
        [1],
    )
