"""Catalog entries of Gemma 3, Gemma 4, MiniMax-M2 and GLM-5 bugs (hooks in convcheck.mutants.gemma3, .gemma4,
.minimax_m2 and .glm5), run in the bridge's own layout (the TE layout for Gemma 3, MiniMax-M2 and GLM-5,
convcheck.models.te_only; Gemma 4's dense provider builds its own local layer spec whatever the layout asks).

Gemma 3's logits already differ on the clean run (te-post-layernorm-default-eps, a finding no planted bug is credited
with), so its entries are those another oracle names: the sandwich norms traded in import and export (mapping names
the tensor and first element), the global layers' RoPE base and the sliding window as the provider builds them
(config names the field). One sliding layer built as a global one changes only the forward: tests/test_gemma3.py
runs it with the epsilon fixed, where logits is the oracle that catches it.

Gemma 4's clean logits pass, so its sliding layer built as a global one is a catalog entry caught by logits, in a
launch of its own: its norms traded (mapping) and its sliding RoPE base (config) change the forward too, so they share
the other launch, which runs no logits.

Gemma 4 MoE's logits differ on the clean run (te-post-layernorm-default-eps), so its entries are those the weight
oracles name, in one launch at TP2xEP2 (the gate case's layout, whose run is their clean one): the dense MLP's and the
experts' input norms traded (mapping names all four tensors, first element [0]) and one layer's per-expert router
scale left at its initial ones (coverage, roundtrip, mapping).
"""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, Mutant, rule_targets
from convcheck.mutants.mutant import HOOKS as _M

GEMMA3, GEMMA4, MINIMAX_M2, GLM5 = "tiny:gemma3", "tiny:gemma4", "tiny:minimax-m2", "tiny:glm5"
GEMMA4_MOE = "tiny:gemma4-moe"

TE_FAMILY_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="gemma3_sandwich_norms_swapped",
        description="Gemma 3 post-attention norm (linear_proj.post_layernorm) <-> HF pre_feedforward_layernorm and "
        "pre-feedforward norm (linear_fc1.layer_norm_weight) <-> post_attention_layernorm, every layer (import and "
        "export)",
        hook=_M + "gemma3:sandwich_norms_swapped",
        fixture=GEMMA3,
        layout="tp2",
        catches=("mapping",),
        targets=(
            "decoder.layers.*.self_attention.linear_proj.post_layernorm.weight",
            "decoder.layers.*.mlp.linear_fc1.layer_norm_weight",
            "model.layers.*.post_attention_layernorm.weight",
            "model.layers.*.pre_feedforward_layernorm.weight",
        ),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="gemma3_global_rope_base_local",
        description="Gemma 3 provider's RoPE bases built (local, local): the global layers rotate with the sliding "
        "layers' base",
        hook=_M + "gemma3:global_rope_base_local",
        fixture=GEMMA3,
        layout="tp2",
        catches=("config",),
        targets=("rope_parameters.sliding_attention+rope_parameters.full_attention*",),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="gemma3_window_one_short",
        description="Gemma 3 provider's window built as sliding_window - 1: every sliding layer attends one position "
        "fewer than HF's",
        hook=_M + "gemma3:window_one_short",
        fixture=GEMMA3,
        layout="tp2",
        catches=("config",),
        targets=("sliding_window*",),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="gemma4_post_attention_norm_pre_feedforward",
        description="Gemma 4 post-attention norm (post_self_attn_layernorm) <-> HF pre_feedforward_layernorm and "
        "pre-feedforward norm (pre_mlp_layernorm) <-> post_attention_layernorm, every layer (import and export)",
        hook=_M + "gemma4:post_attention_norm_pre_feedforward",
        fixture=GEMMA4,
        layout="tp2",
        catches=("mapping",),
        targets=(
            "decoder.layers.*.post_self_attn_layernorm.weight",
            "decoder.layers.*.pre_mlp_layernorm.weight",
            "model.layers.*.post_attention_layernorm.weight",
            "model.layers.*.pre_feedforward_layernorm.weight",
            FORWARD,
        ),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="gemma4_sliding_rope_base_global",
        description="Gemma 4 provider's sliding-layer RoPE base built as the full layers' (1e6): the sliding layers "
        "rotate with the global theta",
        hook=_M + "gemma4:sliding_rope_base_global",
        fixture=GEMMA4,
        layout="tp2",
        catches=("config",),
        targets=(*rule_targets("rope_parameters.sliding_attention", "sliding_window_rope_base"), FORWARD),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="gemma4_sliding_layer_global",
        description="Gemma 4 layer 1 (a sliding layer) built without its window: it attends to every earlier "
        "position, as a full layer does",
        hook=_M + "gemma4:sliding_layer_global",
        fixture=GEMMA4,
        layout="tp2",
        catches=(FORWARD,),
        targets=(FORWARD,),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="gemma4_moe_input_norms_traded",
        description="Gemma 4 MoE experts' input norm (pre_mlp_layernorm) <-> HF pre_feedforward_layernorm (the dense "
        "MLP's) and the dense MLP's (pre_shared_expert_layernorm) <-> pre_feedforward_layernorm_2 (the experts'), "
        "every layer (import and export)",
        hook=_M + "gemma4:moe_input_norms_traded",
        fixture=GEMMA4_MOE,
        layout="tp2ep2",
        catches=("mapping",),
        targets=(
            "decoder.layers.*.pre_mlp_layernorm.weight",
            "decoder.layers.*.pre_shared_expert_layernorm.weight",
            "model.layers.*.pre_feedforward_layernorm.weight",
            "model.layers.*.pre_feedforward_layernorm_2.weight",
            FORWARD,
        ),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="gemma4_moe_per_expert_scale_at_init",
        description="Gemma 4 MoE layer 3's router per_expert_scale left at its initial ones by the import",
        hook=_M + "gemma4:per_expert_scale_left_at_init",
        fixture=GEMMA4_MOE,
        layout="tp2ep2",
        catches=("coverage", "roundtrip", "mapping"),
        targets=("decoder.layers.3.mlp.router.per_expert_scale", "model.layers.3.router.per_expert_scale", FORWARD),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="minimax_m2_expert_bias_at_init",
        description="MiniMax-M2 layer 0's router expert_bias (e_score_correction_bias) left at its initial zeros by "
        "the import",
        hook=_M + "minimax_m2:expert_bias_at_init",
        fixture=MINIMAX_M2,
        layout="tp2ep2",
        catches=("roundtrip", "mapping"),
        targets=("decoder.layers.0.mlp.router.expert_bias", "model.layers.0.block_sparse_moe.e_score_correction_bias"),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="minimax_m2_k_norm_rows_of_other_rank",
        description="MiniMax-M2 layer 0's full-width k_norm: TP rank r imports the rows of rank tp - 1 - r (another "
        "rank's heads)",
        hook=_M + "minimax_m2:k_norm_rows_of_other_rank",
        fixture=MINIMAX_M2,
        layout="tp2ep2",
        catches=("roundtrip", "mapping", "layout"),
        targets=(
            "decoder.layers.0.self_attention.k_layernorm.weight",
            "model.layers.0.self_attn.k_norm.weight",
            "<layout>",
        ),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="minimax_m2_rotary_dim_ignored",
        description="MiniMax-M2 provider's rotary_percent left at 1.0 (rotary_dim not read): every channel rotates",
        hook=_M + "minimax_m2:rotary_dim_ignored",
        fixture=MINIMAX_M2,
        layout="tp2ep2",
        catches=("config",),
        targets=("rotary_dim*", "rope_parameters.partial_rotary_factor*"),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="glm5_indexer_k_norm_not_exported",
        description="GLM-5 DSA indexer: the export writes no layer's k_norm weight (self_attn.indexer.k_norm.weight)",
        hook=_M + "glm5:indexer_k_norm_not_exported",
        fixture=GLM5,
        layout="tp2",
        catches=("coverage", "roundtrip", "mapping"),
        targets=(
            "model.layers.*.self_attn.indexer.k_norm.weight",
            "decoder.layers.*.self_attention.core_attention.indexer.k_norm.weight",
        ),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="glm5_indexer_rope_interleaved",
        description="GLM-5 provider's DSA indexer RoPE built on interleaved pairs, where transformers' indexer "
        "rotates half-split pairs: the top-k key choice changes",
        hook=_M + "glm5:indexer_rope_interleaved",
        fixture=GLM5,
        layout="tp2",
        catches=("config", "logits"),
        targets=("indexer_rope_interleave -> dsa_indexer_rope_interleaved", FORWARD, "greedy-tokens"),
        spec="te",
        experts="auto",
    ),
)
"""Planted Gemma 3, Gemma 4, MiniMax-M2 and GLM-5 bugs, each patching the real Megatron-Bridge classes at run time."""
