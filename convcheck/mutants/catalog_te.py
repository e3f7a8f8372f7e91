"""Catalog entries run in the Transformer Engine layout `verify` builds by default (`--spec te`, experts as the
provider asks): the TE-fused norms' own mapping, and layout bugs that must stay caught under TE's names."""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, LLAMA, MOE, QWEN3, Mutant, qk_targets
from convcheck.mutants.mutant import HOOKS as _M

TE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="te_swap_layer_norm_weights",
        description="TE-fused norms swapped: layer 0's linear_qkv.layer_norm_weight and linear_fc1.layer_norm_weight "
        "mapped to each other's HF norm (import and export alike)",
        hook=_M + "te:swap_layer_norm_weights",
        fixture=QWEN3,
        layout="tp2",
        catches=("mapping", FORWARD),
        targets=("decoder.layers.0.*.layer_norm_weight", "*.layers.0.*layernorm.weight", FORWARD),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="te_swap_qk_head0",
        description="q/k head swap under TE names: QKV export trades layer 0's first q head with its first k head",
        hook=_M + "bridge:swap_qk_head0",
        fixture=LLAMA,
        layout="tp2",
        catches=("roundtrip", "mapping"),
        targets=qk_targets(0),
        spec="te",
        experts="auto",
    ),
    Mutant(
        name="te_drop_expert3",
        description="expert dropped from TEGroupedMLP: the export skips every tensor of layer 1's expert 3",
        hook=_M + "bridge:drop_expert3",
        fixture=MOE,
        layout="tp2ep2",
        catches=("coverage", "roundtrip"),
        targets=("*.layers.1.mlp.experts.3.*", "*.layers.1.mlp.experts.linear_fc[12].weight3"),
        spec="te",
        experts="auto",
    ),
)
