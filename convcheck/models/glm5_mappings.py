"""GLM-5 (GlmMoeDsaForCausalLM) explicit mappings: DeepSeek-V3's (deepseek_mappings: MLA, dense-first MLP, router
with its fp32 expert bias, shared and routed experts, MTP) plus the DSA indexer of every attention layer.

Per decoder layer L, megatron-core's DSA indexer (`self_attention.core_attention.indexer.*`, experimental_attention_
variant/dsa.py:1159-1203: every linear `parallel_mode="duplicated"`, so every TP rank holds it whole) <- HF's
`model.layers.L.self_attn.indexer.*` (n = index_n_heads, d = index_head_dim, R = q_lora_rank, H = hidden):
- `linear_wq_b.weight` `[n * d, R]` <- `wq_b.weight` (the indexer's queries from the q LoRA latent);
- `linear_wk.weight` `[d, H]` <- `wk.weight` (one key head from the hidden states);
- `k_norm.weight`, `k_norm.bias` `[d]` <- `k_norm.weight`, `k_norm.bias` (a LayerNorm over the key, with bias);
- `linear_weights_proj.weight` `[n, H]` <- `weights_proj.weight` (each scoring head's weight per token).
"""

from __future__ import annotations

from convcheck.mappings import Replicated
from convcheck.mappings.registry import MappingRule
from convcheck.models.deepseek_mappings import TRANSFORMER_LAYER, deepseek_rules, hf_layer

INDEXER_TENSORS: dict[str, str] = {
    r"linear_wq_b\.weight": "wq_b.weight",
    r"linear_wk\.weight": "wk.weight",
    r"k_norm\.weight": "k_norm.weight",
    r"k_norm\.bias": "k_norm.bias",
    r"linear_weights_proj\.weight": "weights_proj.weight",
}
"""Megatron indexer parameter (pattern after `self_attention.core_attention.indexer.`) -> HF indexer tensor."""

INDEXER_PREFIX = TRANSFORMER_LAYER + r"self_attention\.core_attention\.indexer\."


def _indexer(pattern: str, hf_suffix: str) -> MappingRule:
    """One indexer tensor, whole on every rank (duplicated over TP)."""
    return MappingRule(
        INDEXER_PREFIX + pattern,
        lambda match, geometry: Replicated(
            megatron=match[0], hf=hf_layer(match, geometry, f"self_attn.indexer.{hf_suffix}")
        ),
    )


INDEXER = tuple(_indexer(pattern, suffix) for pattern, suffix in INDEXER_TENSORS.items())


def glm5_rules(tied: bool) -> list[MappingRule]:
    """Every Megatron parameter of a GLM-5 model: DeepSeek-V3's and the indexer's (tied: the output layer copies the
    embedding; the published GLM-5 is untied)."""
    return [*deepseek_rules(tied), *INDEXER]
