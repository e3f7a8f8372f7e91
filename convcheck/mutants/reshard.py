"""Planted reshard bugs (`--hook convcheck.mutants.reshard:NAME`): one in the real bridge's role detection, the
others in convcheck.reshard's planner, each limited to one named tensor so several can share a launch."""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.param_mapping import AutoMapping

from convcheck.mutants.patch import wrap
from convcheck.reshard import plan, roles

REPLICATED = "decoder.layers.0.self_attention.linear_proj.weight"
"""The tensor replicated_linear_proj misclassifies (run it at trainer TP1: the import then still fits)."""
NO_DEINTERLEAVE = "decoder.layers.0.self_attention.linear_qkv.weight"
KV_NOT_REPLICATED = "decoder.layers.1.self_attention.linear_qkv.weight"
WRONG_ROW_SOURCE = "decoder.layers.1.self_attention.linear_proj.weight"


def replicated_linear_proj() -> None:
    """AutoMapping resolves layer 0's attention output projection (row parallel) to ReplicatedMapping."""

    def make(original: Any) -> Any:
        def detect(self, module):  # type: ignore[no-untyped-def]
            return "replicated" if self.megatron_param == REPLICATED else original(self, module)

        return detect

    wrap(AutoMapping, "_detect_parallelism_type", make)


def qkv_no_deinterleave() -> None:
    """The planner reads layer 0's fused qkv as if it were [all q; all k; all v] (no per-group interleave)."""

    def make(original: Any) -> Any:
        def row(role, part, head):  # type: ignore[no-untyped-def]
            if role.name != NO_DEINTERLEAVE:
                return original(role, part, head)
            nh, nkv, d = role.heads
            return {"q": head, "k": nh + head, "v": nh + nkv + head}[part] * d

        return row

    wrap(plan, "megatron_qkv_row", make)


def kv_not_replicated() -> None:
    """With fewer kv heads than target TP, layer 1's kv heads are dealt round-robin instead of replicated in blocks."""

    def make(original: Any) -> Any:
        def heads(role, tp, p):  # type: ignore[no-untyped-def]
            nkv = role.heads[1]
            if role.name != KV_NOT_REPLICATED or nkv >= tp:
                return original(role, tp, p)
            return range(p % nkv, p % nkv + 1)

        return heads

    wrap(plan, "kv_heads_for", make)


def wrong_row_source() -> None:
    """Layer 1's row-parallel linear_proj pieces are read from the trainer rank of the next TP shard."""
    _read_next_shard(WRONG_ROW_SOURCE)


def _read_next_shard(target_name: str) -> None:
    """Plant: every planned piece of parameter `target_name` is read from the trainer rank of the next shard."""
    from dataclasses import replace

    def make(original: Any) -> Any:
        def plan_param(role, shards, layout, target, world):  # type: ignore[no-untyped-def]
            out = original(role, shards, layout, target, world)
            count = shards[0].count
            if role.name != target_name or count < 2:
                return out
            index = {(s.rank, s.local): s.index for s in shards}
            pieces = []
            for piece in out.pieces:
                other = next(s for s in shards if s.index == (index[(piece.rank, piece.key)] + 1) % count)
                pieces.append(replace(piece, rank=other.rank, key=other.local))
            return replace(out, pieces=tuple(pieces))

        return plan_param

    wrap(plan, "plan_param", make)


def local_expert_id() -> None:
    """Trainer expert shards are registered under their local expert id (local_experts.N of the rank), not the
    global one."""
    wrap(roles, "megatron_name", lambda original: lambda task: task.param_name)


EXPERT_ROW = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"
"""The expert down projection expert_row_wrong_etp_source reads from the wrong trainer expert-TP rank (ETP > 1)."""
EXPERT_GATED = "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"
"""The expert gate|up projection expert_gate_up_not_deinterleaved plans as plain rows."""
SWAPPED_EXPERT = 7
"""The global expert id whose target placement target_expert_axes_swapped computes with EP innermost."""


def expert_row_wrong_etp_source() -> None:
    """Layer 0 expert 1's row-parallel linear_fc2 pieces are read from the trainer rank of the next expert-TP shard."""
    _read_next_shard(EXPERT_ROW)


def expert_gate_up_not_deinterleaved() -> None:
    """Layer 1 expert 2's linear_fc1 is planned as plain column rows of the trainer's fc1 shards (each packed
    [gate shard; up shard]), so a target expert-TP rank gets a block of that packing, not [its gate; its up]."""
    from dataclasses import replace

    def make(original: Any) -> Any:
        def plan_param(role, shards, layout, target, world):  # type: ignore[no-untyped-def]
            if role.name != EXPERT_GATED:
                return original(role, shards, layout, target, world)
            (gate, _up), rows = role.hf_shapes, sum(s[0] for s in role.hf_shapes)
            plain = replace(role, kind="column", hf_shapes=((rows, *gate[1:]),))
            return original(plain, shards, layout, target, world)

        return plan_param

    wrap(plan, "plan_param", make)


def target_expert_axes_swapped() -> None:
    """The planner places expert 7 on the target grid with EP innermost (ep rank r % ep, etp rank (r // ep) % etp)
    instead of expert TP innermost."""

    def make(original: Any) -> Any:
        def placement(layout, target, expert):  # type: ignore[no-untyped-def]
            if expert != SWAPPED_EXPERT:
                return original(layout, target, expert)
            ep_rank, etp_rank = target % layout.ep, (target // layout.ep) % layout.etp
            per_rank = layout.num_experts // layout.ep
            return (etp_rank, layout.etp) if ep_rank * per_rank <= expert < (ep_rank + 1) * per_rank else None

        return placement

    wrap(plan, "placement", make)


GDN_IN_PROJ = "decoder.layers.1.self_attention.in_proj.weight"
"""The GDN in_proj whose sections gdn_sections_misordered reads as [q, v, k, z, beta, alpha]."""
GATED_QKV = "decoder.layers.3.self_attention.linear_qkv.weight"
"""The gated fused qkv whose q and gate heads gated_qkv_q_gate_swapped trades."""
GDN_NORM = "decoder.layers.2.self_attention.out_norm.weight"
"""The zero-centered GDN output norm whose value offset norm_offset_dropped leaves out."""


def gdn_sections_misordered() -> None:
    """Layer 1's GDN in_proj: the sections megatron-core reports ([q, k, v, z, beta, alpha]) are read as [q, v, k,
    z, beta, alpha] (every piece still fits the trainer shard)."""

    def make(original: Any) -> Any:
        def sections(module, param, tp):  # type: ignore[no-untyped-def]
            out = original(module, param, tp)
            return (out[0], out[2], out[1], *out[3:]) if param == GDN_IN_PROJ else out

        return sections

    wrap(roles, "megatron_sections", make)


def gated_qkv_q_gate_swapped() -> None:
    """Layer 3's gated fused qkv: the planner reads each q head from its gate rows and the gate from its q rows."""

    def make(original: Any) -> Any:
        def row(role, part, head):  # type: ignore[no-untyped-def]
            if role.name == GATED_QKV and part in ("q", "gate"):
                part = "gate" if part == "q" else "q"
            return original(role, part, head)

        return row

    wrap(plan, "megatron_qkv_row", make)


def norm_offset_dropped() -> None:
    """Layer 2's zero-centered GDN out_norm is planned without its value offset: the target gets Megatron's HF - 1."""
    from dataclasses import replace

    def make(original: Any) -> Any:
        def plan_param(role, shards, layout, target, world):  # type: ignore[no-untyped-def]
            out = original(role, shards, layout, target, world)
            return replace(out, offset=0.0) if role.name == GDN_NORM else out

        return plan_param

    wrap(plan, "plan_param", make)
