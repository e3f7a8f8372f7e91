"""Planted bugs on the engine path, as a trainer's sync code would carry them: senders (`--sender
convcheck.mutants.engine:NAME`, on the rank side) whose tensors the engine oracle must name. The engine-side
receivers live in convcheck.mutants.engine_receivers (imported inside the engine process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from convcheck.rank.context import RankContext

SWAPPED_Q = "model.layers.1.self_attn.q_proj.weight"
SWAPPED_K = "model.layers.1.self_attn.k_proj.weight"
"""swap_q_k_head swaps the first head's rows of these two (head_dim rows each)."""
EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


def swap_q_k_head(ctx: RankContext) -> Iterator[tuple[str, Any]]:
    """The bridge's export, with layer 1's first query head and first key head exchanged (rows [0, head_dim) of
    q_proj and k_proj): q and k sent swapped."""
    head_dim = int(ctx.checkpoint.config.get("head_dim") or 0)
    held: dict[str, Any] = {}
    for name, tensor in ctx.bridge_export():
        if name in (SWAPPED_Q, SWAPPED_K):
            held[name] = tensor.clone()
            if len(held) < 2:
                continue
            q, k = held[SWAPPED_Q], held[SWAPPED_K]
            rows = q[:head_dim].clone()
            q[:head_dim] = k[:head_dim]
            k[:head_dim] = rows
            yield SWAPPED_Q, q
            yield SWAPPED_K, k
            continue
        yield name, tensor


def embedding_as_lm_head(ctx: RankContext) -> Iterator[tuple[str, Any]]:
    """A tied model's embedding sent only as `lm_head.weight` (the one side a trainer holding an untied copy
    updates): an engine that ties lm_head to the embedding never updates its embedding."""
    for name, tensor in ctx.bridge_export():
        yield (LM_HEAD if name == EMBED else name), tensor


def drop_ep_rank_1_experts(ctx: RankContext) -> Iterator[tuple[str, Any]]:
    """The export without the routed experts EP rank 1 holds (the upper half of every MoE layer's experts): one EP
    rank's experts never sent."""
    import re

    experts = int(ctx.checkpoint.config.get("num_experts") or ctx.checkpoint.config.get("n_routed_experts") or 0)
    pattern = re.compile(r"\.mlp\.experts\.(\d+)\.")
    for name, tensor in ctx.bridge_export():
        match = pattern.search(name)
        if match is not None and int(match.group(1)) >= experts // 2:
            continue
        yield name, tensor


MLA_FLIPPED = ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.1.self_attn.kv_b_proj.weight")
"""flip_mla_elements flips the sign of element [1, 2] of these two (vLLM packs the first into fused_qkv_a_proj after
q_a_proj's rows and splits the second into W_UK_T / W_UV)."""


def flip_mla_elements(ctx: RankContext) -> Iterator[tuple[str, Any]]:
    """The bridge's export with one element of layer 0's kv_a_proj_with_mqa and of layer 1's kv_b_proj sign-flipped
    (a sender that corrupts MLA's latent projections)."""
    for name, tensor in ctx.bridge_export():
        if name in MLA_FLIPPED:
            tensor = tensor.clone()
            tensor[1, 2] = -tensor[1, 2]
        yield name, tensor


def drop_mtp(ctx: RankContext) -> Iterator[tuple[str, Any]]:
    """The export without the multi-token-prediction tensors (`mtp.*`, or `model.layers.{num_hidden_layers + k}.*`):
    a sender that syncs only the main model, leaving the engine's draft weights as they were."""
    layers = int(ctx.checkpoint.config.get("num_hidden_layers") or 0)
    for name, tensor in ctx.bridge_export():
        parts = name.split(".")
        if name.startswith("mtp.") or (parts[:2] == ["model", "layers"] and int(parts[2]) >= layers):
            continue
        yield name, tensor
