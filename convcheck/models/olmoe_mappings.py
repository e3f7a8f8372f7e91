"""OLMoE's explicit mappings: the Llama-style decoder of `dense.py` with MoE layers and full-width q/k norms.

OLMoE's q_norm `[num_heads * head_dim]` and k_norm `[num_kv_heads * head_dim]` are one RMSNorm over every head, which
the bridge's OLMoESelfAttention holds whole on every TP rank (megatron-bridge 0.6.2 olmoe_provider.py:121-135): the
same Replicated mapping as Qwen3's per-head norms (dense.ATTENTION), not split by heads.
"""

from __future__ import annotations

from convcheck.mappings.registry import MappingRule
from convcheck.models.dense_mappings import ATTENTION, EMBEDDING_AND_FINAL_NORM, EXPERTS, LAYER_NORMS, output_layer


def olmoe_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of an OLMoE decoder (every layer MoE: router and routed experts, no dense MLP)."""
    return [*EMBEDDING_AND_FINAL_NORM, *LAYER_NORMS, *ATTENTION, *EXPERTS, output_layer(tied)]
