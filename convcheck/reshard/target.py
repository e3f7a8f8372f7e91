"""The reference target shards: what a rollout rank at target TP/EP/ETP holds, computed straight from the HF tensors.

Target rank r has tp rank p = r % tp for dense tensors, and for experts etp rank q = r % etp and ep rank
(r // etp) % ep (expert TP innermost, as Megatron orders its expert grid; world lcm(tp, ep * etp)). Per role (shapes
for a [rows, cols] HF weight), with (i, n) = (p, tp) for a dense tensor and (q, etp) for an expert's:
- qkv: [q heads of p; k heads; v heads], [(nh/tp + 2 * kvh) * d, hidden], kvh = nkv/tp, or 1 when nkv < tp:
  the kv head p // (tp / nkv), replicated on tp / nkv ranks; with an output gate each q head is HF q_proj's 2d rows
  [q; gate] of that head;
- sections (GDN in_proj, conv1d): the HF tensors cut into their sections (de-grouped where HF interleaves them per
  key head), then [rows p of section 0; rows p of section 1; ...], each section split evenly over tp;
- gated: [gate rows of i; up rows of i], [2 * ffn/n, hidden] (vLLM's w13 under TP: gate|up packed per rank);
- column (vocab too): rows [i*m, (i+1)*m), m = ceil(rows/n), rows past the end zero: [m, cols];
- row: the same along cols: [rows, ceil(cols/n)] (an expert's down projection: vLLM's w2 under TP);
- replicated: the whole tensor;
- a value offset (zero-centered norm): none here, the reference is the HF value (the executor adds the offset);
- experts: only on the target ranks whose ep rank owns them (experts/ep consecutive global ids), split over etp.
Written independently of the planner (plan.py reads Megatron's interleaved layout; this reads HF's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from convcheck.errors import BadInput


@dataclass(frozen=True, kw_only=True, slots=True)
class TargetLayout:
    """A rollout engine's layout: `tp` ranks per dense tensor, experts over `ep` ranks, each split over `etp`."""

    tp: int = 1
    ep: int = 1
    etp: int = 1
    """Expert TP: ranks one expert is split over (1: whole on its EP rank; vLLM without EP: etp = tp)."""
    num_experts: int = 0
    """Experts per MoE layer (0: a dense model)."""

    def __post_init__(self) -> None:
        for field_name in ("tp", "ep", "etp"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadInput(f"target {field_name} must be a positive integer, got {value!r}")
        if self.ep > 1 and (self.num_experts == 0 or self.num_experts % self.ep):
            raise BadInput(f"target ep {self.ep} must divide the number of experts ({self.num_experts})")
        if self.etp > 1 and self.num_experts == 0:
            raise BadInput(f"target etp {self.etp} needs a model with experts")

    @property
    def world(self) -> int:
        return math.lcm(self.tp, self.ep * self.etp)

    @property
    def label(self) -> str:
        return f"tp{self.tp}" + (f"ep{self.ep}" if self.ep > 1 else "") + (f"etp{self.etp}" if self.etp > 1 else "")

    def expert_coord(self, rank: int) -> tuple[int, int]:
        """(ep rank, etp rank) of target `rank`: expert TP innermost."""
        return (rank // self.etp) % self.ep, rank % self.etp

    def holds(self, rank: int, expert: int | None) -> bool:
        """Whether target `rank` holds a dense parameter (expert None) or global expert `expert`."""
        if expert is None:
            return True
        return expert // (self.num_experts // self.ep) == self.expert_coord(rank)[0]

    def split(self, rank: int, expert: int | None) -> tuple[int, int]:
        """(index, count) of target `rank`'s split of a dense parameter (tp) or an expert's (etp)."""
        return (rank % self.tp, self.tp) if expert is None else (self.expert_coord(rank)[1], self.etp)


def reference_kind(role: Any) -> str:
    """The split the reference uses: the packing from the bridge class, the split from megatron-core's attributes."""
    return role.kind if role.kind in ("qkv", "gated", "sections") else role.core_split


def hf_section_list(role: Any, hf: list[Any]) -> list[Any]:
    """Every section of `role` in order, whole, cut from the HF tensors (per tensor: `groups` interleaved groups,
    each [its rows of section 0; of section 1; ...])."""
    out = []
    for tensor, sizes, groups in zip(hf, role.hf_sections, role.hf_groups, strict=True):
        grouped = tensor.reshape(groups, -1, *tensor.shape[1:])
        at = 0
        for size in sizes:
            out.append(grouped[:, at : at + size // groups].reshape(size, *tensor.shape[1:]))
            at += size // groups
    return out


def reference_shard(role: Any, hf: list[Any], layout: TargetLayout, rank: int) -> Any:
    """Target rank `rank`'s shard of `role` from its HF tensors `hf` (in role.hf order)."""
    kind = reference_kind(role)
    p, tp = layout.split(rank, role.expert)
    if kind == "qkv":
        nh, nkv, d = role.heads
        q, k, v = hf
        qn, qd = nh // tp, 2 * d if role.gate else d
        kv = range(p * nkv // tp, (p + 1) * nkv // tp) if nkv >= tp else range(p // (tp // nkv), p // (tp // nkv) + 1)
        heads = [q[h * qd : (h + 1) * qd] for h in range(p * qn, (p + 1) * qn)]
        heads += [k[g * d : (g + 1) * d] for g in kv] + [v[g * d : (g + 1) * d] for g in kv]
        return torch.cat(heads, 0)
    if kind == "sections":
        chunks = [s[p * (s.shape[0] // tp) : (p + 1) * (s.shape[0] // tp)] for s in hf_section_list(role, hf)]
        return torch.cat(chunks, 0)
    if kind == "gated":
        n = hf[0].shape[0] // tp
        return torch.cat([hf[0][p * n : (p + 1) * n], hf[1][p * n : (p + 1) * n]], 0)
    if kind in ("column", "row"):
        dim = 0 if kind == "column" else 1
        full = hf[0]
        n = -(-full.shape[dim] // tp)
        part = full.narrow(dim, min(p * n, full.shape[dim]), max(0, min(n, full.shape[dim] - p * n)))
        shape = list(full.shape)
        shape[dim] = n
        out = torch.zeros(shape, dtype=full.dtype)
        out.narrow(dim, 0, part.shape[dim]).copy_(part)
        return out
    return hf[0].clone()
