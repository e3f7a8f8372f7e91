"""The reference target shards: what a rollout rank at target TP/EP holds, computed straight from the HF tensors.

Per role, for target rank r with tp rank p = r % tp (shapes for a [rows, cols] HF weight):
- qkv: [q heads of p; k heads; v heads], [(nh/tp + 2 * kvh) * d, hidden], kvh = nkv/tp, or 1 when nkv < tp:
  the kv head p // (tp / nkv), replicated on tp / nkv ranks;
- gated: [gate rows of p; up rows of p], [2 * ffn/tp, hidden];
- column (vocab too): rows [p*n, (p+1)*n), n = ceil(rows/tp), rows past the end zero: [n, cols];
- row: the same along cols: [rows, ceil(cols/tp)];
- replicated: the whole tensor;
- experts: whole (expert TP 1) on the target ranks whose ep rank r % ep owns them (experts/ep consecutive ids).
Written independently of the planner (plan.py reads Megatron's interleaved layout; this reads HF's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from convcheck.errors import BadInput


@dataclass(frozen=True, kw_only=True, slots=True)
class TargetLayout:
    """A rollout engine's layout: `tp` ranks per dense tensor, experts over `ep` ranks; lcm(tp, ep) ranks."""

    tp: int = 1
    ep: int = 1
    num_experts: int = 0
    """Experts per MoE layer (0: a dense model)."""

    def __post_init__(self) -> None:
        for field_name in ("tp", "ep"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadInput(f"target {field_name} must be a positive integer, got {value!r}")
        if self.ep > 1 and (self.num_experts == 0 or self.num_experts % self.ep):
            raise BadInput(f"target ep {self.ep} must divide the number of experts ({self.num_experts})")

    @property
    def world(self) -> int:
        return math.lcm(self.tp, self.ep)

    @property
    def label(self) -> str:
        return f"tp{self.tp}" + (f"ep{self.ep}" if self.ep > 1 else "")

    def holds(self, rank: int, expert: int | None) -> bool:
        """Whether target `rank` holds a dense parameter (expert None) or global expert `expert`."""
        if expert is None:
            return True
        return expert // (self.num_experts // self.ep) == rank % self.ep


def reference_kind(role: Any) -> str:
    """The split the reference uses: the packing from the bridge class, the split from megatron-core's attributes."""
    return role.kind if role.kind in ("qkv", "gated") else role.core_split


def reference_shard(role: Any, hf: list[Any], layout: TargetLayout, rank: int) -> Any:
    """Target rank `rank`'s shard of `role` from its HF tensors `hf` (in role.hf order)."""
    import torch

    kind, p, tp = reference_kind(role), rank % layout.tp, layout.tp
    if role.expert is not None:
        return torch.cat(hf, 0) if kind == "gated" else hf[0].clone()
    if kind == "qkv":
        nh, nkv, d = role.heads
        q, k, v = hf
        qn = nh // tp
        kv = range(p * nkv // tp, (p + 1) * nkv // tp) if nkv >= tp else range(p // (tp // nkv), p // (tp // nkv) + 1)
        heads = [q[h * d : (h + 1) * d] for h in range(p * qn, (p + 1) * qn)]
        heads += [k[g * d : (g + 1) * d] for g in kv] + [v[g * d : (g + 1) * d] for g in kv]
        return torch.cat(heads, 0)
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
