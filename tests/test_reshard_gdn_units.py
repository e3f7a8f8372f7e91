"""Reshard of the GDN hybrids' tensors on index-coded tensors in one process (no ranks, no bridge): the sectioned
in_proj / conv1d, the gated fused qkv and the zero-centered norm's value offset.

The trainer shards are built here in megatron-core's per-rank layout from the sections, so the planner (which reads
Megatron's layout) and the reference (which reads HF's) meet only in the comparison.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from convcheck.compare.bits import compare_bits
from convcheck.reshard.execute import execute
from convcheck.reshard.plan import build_plan, coverage, megatron_qkv_row
from convcheck.reshard.roles import ParamRole, Shard, role_mismatch
from convcheck.reshard.target import TargetLayout, hf_section_list, reference_shard

NK, DK, NV, DV, H, KERNEL = 2, 4, 4, 3, 5, 4
QK, V = NK * DK, NV * DV


def _coded(shape: tuple[int, ...], start: int) -> torch.Tensor:
    return torch.arange(start, start + torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)


def _sections_role(name: str, hf: dict[str, torch.Tensor], sizes, groups, sections) -> ParamRole:  # type: ignore[no-untyped-def]
    return ParamRole(
        name=name, kind="sections", core_split="column", hf=tuple(hf), hf_shapes=tuple(tuple(t.shape) for t in
        hf.values()), expert=None, sections=sections, hf_sections=sizes, hf_groups=groups,
    )  # fmt: skip


def _next_in_proj() -> tuple[ParamRole, dict[str, torch.Tensor], list[torch.Tensor]]:
    """Qwen3-Next: qkvz [per key head: q dk, k dk, v, z (nv/nk * dv each)] and ba [per key head: b, a (nv/nk)]."""
    qkvz, ba = _coded((2 * QK + 2 * V, H), 0), _coded((2 * NV, H), 10_000)
    hf = {"qkvz": qkvz, "ba": ba}
    per_q, per_v = DK, NV // NK * DV
    g = qkvz.reshape(NK, -1, H)
    q, k = g[:, :per_q], g[:, per_q : 2 * per_q]
    v, z = g[:, 2 * per_q : 2 * per_q + per_v], g[:, 2 * per_q + per_v :]
    gb = ba.reshape(NK, -1, H)
    b, a = gb[:, : NV // NK], gb[:, NV // NK :]
    whole = [t.reshape(-1, H) for t in (q, k, v, z, b, a)]
    role = _sections_role("in_proj", hf, ((QK, QK, V, V), (NV, NV)), (NK, NK), (QK, QK, V, V, NV, NV))
    return role, hf, whole


def _separate_in_proj() -> tuple[ParamRole, dict[str, torch.Tensor], list[torch.Tensor]]:
    """Qwen3.5: flat qkv [q; k; v], z, b, a."""
    hf = {"qkv": _coded((2 * QK + V, H), 0), "z": _coded((V, H), 5000), "b": _coded((NV, H), 7000)}
    hf["a"] = _coded((NV, H), 8000)
    whole = [hf["qkv"][:QK], hf["qkv"][QK : 2 * QK], hf["qkv"][2 * QK :], hf["z"], hf["b"], hf["a"]]
    role = _sections_role("in_proj", hf, ((QK, QK, V), (V,), (NV,), (NV,)), (1, 1, 1, 1), (QK, QK, V, V, NV, NV))
    return role, hf, whole


def _conv1d() -> tuple[ParamRole, dict[str, torch.Tensor], list[torch.Tensor]]:
    """conv1d weight [channels q; k; v flat, 1, kernel]."""
    hf = {"conv": _coded((2 * QK + V, 1, KERNEL), 0)}
    whole = [hf["conv"][:QK], hf["conv"][QK : 2 * QK], hf["conv"][2 * QK :]]
    return _sections_role("conv1d", hf, ((QK, QK, V),), (1,), (QK, QK, V)), hf, whole


def _megatron_shards(name: str, whole: list[torch.Tensor], tp: int) -> tuple[list[Shard], dict[str, torch.Tensor]]:
    """megatron-core's per-rank layout: shard i = [rows i of section 0; rows i of section 1; ...], all on rank 0."""
    shards, tensors = [], {}
    for i in range(tp):
        part = torch.cat([s[i * (s.shape[0] // tp) : (i + 1) * (s.shape[0] // tp)] for s in whole]).contiguous()
        tensors[f"{name}@{i}"] = part
        shards.append(Shard(rank=0, local=f"{name}@{i}", index=i, count=tp, shape=tuple(part.shape), dtype="float32"))
    return shards, tensors


CASES = {"next-in-proj": _next_in_proj, "separate-in-proj": _separate_in_proj, "conv1d": _conv1d}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("trainer_tp", [1, 2])
@pytest.mark.parametrize("target_tp", [1, 2, 4])
def test_sections_assembled_equal_reference(case: str, trainer_tp: int, target_tp: int) -> None:
    role, hf, whole = CASES[case]()
    shards, tensors = _megatron_shards(role.name, whole, trainer_tp)
    layout = TargetLayout(tp=target_tp)
    plans, findings = build_plan({role.name: role}, {role.name: shards}, layout, world=1)
    assert findings == [] and [coverage(p, {role.name: shards}) for p in plans] == [None] * target_tp
    assembled, moved = execute(plans, tensors, rank=0, world=1)
    assert sorted(assembled) == [(t, role.name) for t in range(target_tp)]
    for (target, name), got in assembled.items():
        assert compare_bits(name, reference_shard(role, list(hf.values()), layout, target), got) is None, target
    assert all(m.moved_bytes == m.shard_bytes and m.padding_bytes == 0 for m in moved.values())


def test_hf_sections_of_qwen3_next_are_de_grouped() -> None:
    """Key head 1's q rows follow key head 0's whole group in qkvz: section q is rows [0..3] then [22..25]."""
    role, hf, _ = _next_in_proj()
    q = hf_section_list(role, list(hf.values()))[0]
    group = 2 * DK + 2 * NV // NK * DV
    rows = torch.cat([torch.arange(DK), group + torch.arange(DK)])
    assert torch.equal(q.view(torch.int32), hf["qkvz"][rows].view(torch.int32))


def test_target_rank_holds_its_chunk_of_every_section() -> None:
    """Target TP2 rank 1 of the Qwen3.5 in_proj: [q rows 4..7; k 4..7; v 6..11; z 6..11; b 2..3; a 2..3]."""
    role, hf, _ = _separate_in_proj()
    got = reference_shard(role, list(hf.values()), TargetLayout(tp=2), 1)
    qkv = hf["qkv"]
    want = torch.cat([qkv[4:8], qkv[12:16], qkv[22:28], hf["z"][6:12], hf["b"][2:4], hf["a"][2:4]])
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_section_order_wrong_in_the_plan_is_caught_at_the_first_wrong_element() -> None:
    """A planner reading Megatron's in_proj as [q, v, k, z, b, a] (every piece still fits) assembles target TP1
    rows 12..23 wrong: from row 12 trainer rank 0's v rows where trainer rank 1's k rows belong."""
    role, hf, whole = _next_in_proj()
    shards, tensors = _megatron_shards(role.name, whole, 2)
    layout = TargetLayout(tp=1)
    bad = replace(role, sections=(QK, V, QK, V, NV, NV))
    plans, findings = build_plan({role.name: bad}, {role.name: shards}, layout, world=1)
    assert findings == [] and coverage(plans[0], {role.name: shards}) is None
    assembled, _ = execute(plans, tensors, rank=0, world=1)
    finding = compare_bits(role.name, reference_shard(role, list(hf.values()), layout, 0), assembled[(0, role.name)])
    assert finding is not None and (finding.kind, finding.detail["first_index"]) == ("bytes-differ", [12, 0])
    assert finding.detail["count"] == 12 * H


def _gated_qkv() -> tuple[ParamRole, dict[str, torch.Tensor]]:
    """attention_output_gate: HF q_proj per head [q (d); gate (d)], 4 heads, 2 kv groups, d 3."""
    nh, nkv, d = 4, 2, 3
    hf = {"q": _coded((2 * nh * d, H), 0), "k": _coded((nkv * d, H), 1000), "v": _coded((nkv * d, H), 2000)}
    role = ParamRole(
        name="qkv", kind="qkv", core_split="column", hf=("q", "k", "v"), hf_shapes=tuple(tuple(t.shape) for t in
        hf.values()), expert=None, heads=(nh, nkv, d), gate=True,
    )  # fmt: skip
    return role, hf


def _gated_megatron_full(hf: dict[str, torch.Tensor], nh: int, nkv: int, d: int) -> torch.Tensor:
    """megatron-core's fused qkv with an output gate: per group [q heads of g; gate heads of g; k_g; v_g]."""
    per, rows = nh // nkv, []
    for g in range(nkv):
        heads = range(g * per, (g + 1) * per)
        rows += [hf["q"][2 * h * d : (2 * h + 1) * d] for h in heads]
        rows += [hf["q"][(2 * h + 1) * d : (2 * h + 2) * d] for h in heads]
        rows += [hf["k"][g * d : (g + 1) * d], hf["v"][g * d : (g + 1) * d]]
    return torch.cat(rows)


@pytest.mark.parametrize("trainer_tp", [1, 2])
@pytest.mark.parametrize("target_tp", [1, 2, 4])
def test_gated_qkv_assembled_equals_reference(trainer_tp: int, target_tp: int) -> None:
    role, hf = _gated_qkv()
    full = _gated_megatron_full(hf, *role.heads)
    n = full.shape[0] // trainer_tp
    tensors = {f"qkv@{i}": full[i * n : (i + 1) * n].clone() for i in range(trainer_tp)}
    shards = [Shard(rank=0, local=f"qkv@{i}", index=i, count=trainer_tp, shape=(n, H), dtype="float32")
              for i in range(trainer_tp)]  # fmt: skip
    layout = TargetLayout(tp=target_tp)
    plans, findings = build_plan({"qkv": role}, {"qkv": shards}, layout, world=1)
    assert findings == [] and [coverage(p, {"qkv": shards}) for p in plans] == [None] * target_tp
    assembled, moved = execute(plans, tensors, rank=0, world=1)
    for (target, name), got in assembled.items():
        assert compare_bits(name, reference_shard(role, list(hf.values()), layout, target), got) is None, target
    assert all(m.moved_bytes == m.shard_bytes for m in moved.values())


def test_gated_qkv_rows() -> None:
    """Group 1 of 4 heads / 2 groups, d 3: [q2; q3; gate2; gate3; k1; v1] from row 18 (block of 6 heads' rows)."""
    role, _ = _gated_qkv()
    rows = [megatron_qkv_row(role, part, h) for part, h in (("q", 2), ("q", 3), ("gate", 2), ("gate", 3))]
    assert rows + [megatron_qkv_row(role, "k", 1), megatron_qkv_row(role, "v", 1)] == [18, 21, 24, 27, 30, 33]
    assert megatron_qkv_row(replace(role, gate=False), "k", 1) == 18  # ungated group 1: [q2; q3] rows 12-17


def test_gated_qkv_without_the_gate_flag_is_caught() -> None:
    """The same trainer shards planned as an ungated qkv: the shape differs (no gate rows), named on the tensor."""
    role, hf = _gated_qkv()
    full = _gated_megatron_full(hf, *role.heads)
    shards = [Shard(rank=0, local="qkv@0", index=0, count=1, shape=tuple(full.shape), dtype="float32")]
    plain = replace(role, gate=False, hf_shapes=((12, H), (6, H), (6, H)))
    plans, _ = build_plan({"qkv": plain}, {"qkv": shards}, TargetLayout(tp=1), world=1)
    assembled, _ = execute(plans, {"qkv@0": full}, rank=0, world=1)
    expected = reference_shard(role, list(hf.values()), TargetLayout(tp=1), 0)
    finding = compare_bits("qkv", expected, assembled[(0, "qkv")])
    assert finding is not None and (finding.kind, finding.detail) == (
        "shape",
        {"expected": [36, H], "actual": [24, H]},
    )


def test_zero_centered_norm_moves_megatron_bytes_and_adds_the_offset() -> None:
    """Megatron holds HF - 1; the target holds HF (the export's + 1 in the tensor's dtype), bitwise."""
    hf = torch.tensor([1.0, 0.75, 1.25, 1.0078125], dtype=torch.bfloat16)
    role = ParamRole(name="norm", kind="replicated", core_split="replicated", hf=("n",), hf_shapes=((4,),),
                     expert=None, offset=1.0)  # fmt: skip
    shard = Shard(rank=0, local="n@0", index=0, count=1, shape=(4,), dtype="bfloat16")
    plans, _ = build_plan({"norm": role}, {"norm": [shard]}, TargetLayout(tp=2), world=1)
    assembled, moved = execute(plans, {"n@0": hf - 1}, rank=0, world=1)
    for target in (0, 1):
        got = assembled[(target, "norm")]
        assert compare_bits("norm", reference_shard(role, [hf], TargetLayout(tp=2), target), got) is None
    assert moved[0].moved_bytes == moved[0].shard_bytes == 8
    unshifted, _ = execute([replace(plans[0], offset=0.0)], {"n@0": hf - 1}, rank=0, world=1)
    finding = compare_bits("norm", hf, unshifted[(0, "norm")])
    assert finding is not None and finding.detail["first_index"] == [0] and finding.detail["count"] == 4


def test_uneven_sections_are_a_finding() -> None:
    role, _, whole = _conv1d()
    shards, _ = _megatron_shards(role.name, whole, 1)
    plans, findings = build_plan({role.name: role}, {role.name: shards}, TargetLayout(tp=8), world=1)
    assert plans == [] and [(f.tensor, f.kind, f.message) for f in findings] == [
        ("conv1d", "plan-indivisible", "target tp8: section(s) of [12] rows do not split over target tp 8 and "
         "trainer tp 1"),
    ]  # fmt: skip


def test_sections_role_is_column_for_megatron_core() -> None:
    role, _, _ = _conv1d()
    assert role_mismatch(role) is None
    finding = role_mismatch(replace(role, core_split="replicated"))
    assert finding is not None and finding.detail == {"bridge": "sections", "core": "replicated"}
