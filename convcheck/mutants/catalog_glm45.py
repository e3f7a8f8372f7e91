"""Catalog entries of GLM-4.5 bugs (hooks in convcheck.mutants.glm45, and the fp32 expert-bias downcast of
convcheck.mutants.bridge): the q/k/v bias interleave, the float32 router expert bias, the MTP layer's HF source and
the partial rotary embedding.

The bias interleave is symmetric (a roundtrip is exact): the mapping oracle names the shard and its first wrong
element, the logits oracle the changed forward. The MTP and expert-bias bugs are named by tensor and first element
(roundtrip, mapping); the lost partial rotary by the config oracle's rule and the logits.
"""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, Mutant, rule_targets
from convcheck.mutants.mutant import HOOKS as _M

GLM45, GLM45_AIR = "tiny:glm4.5", "tiny:glm4.5-air"
TE_GROUPED = "te-grouped"
"""Every GLM-4.5 mutant runs on TEGroupedMLP's expert names: with SequentialMLP experts the pinned bridge's load and
export crash (the known bug glm45-sequential-experts-unmapped), which would hide any planted bug."""

GLM45_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="glm45_qkv_bias_not_interleaved",
        description="GLM-4.5 q/k/v bias: the fused linear_qkv.bias is [q; k; v] concatenated, not interleaved per "
        "query group (import and export alike)",
        hook=_M + "glm45:qkv_bias_not_interleaved",
        fixture=GLM45,
        layout="tp2",
        experts=TE_GROUPED,
        catches=("mapping", "logits"),
        targets=("*.self_attention.linear_qkv.bias", "*.self_attn.[qkv]_proj.bias", FORWARD),
    ),
    Mutant(
        name="glm45_expert_bias_left_at_init",
        description="GLM-4.5 expert bias left at init: the import of layer 2's e_score_correction_bias writes nothing",
        hook=_M + "glm45:expert_bias_left_at_init",
        fixture=GLM45,
        layout="ep2",
        experts=TE_GROUPED,
        catches=("coverage", "roundtrip", "mapping"),
        targets=("decoder.layers.2.mlp.router.expert_bias", "*.layers.2.mlp.gate.e_score_correction_bias", FORWARD),
    ),
    Mutant(
        name="glm45_expert_bias_downcast",
        description="GLM-4.5 expert bias dtype: the export casts the fp32 e_score_correction_bias to bf16",
        hook=_M + "bridge:downcast_router_bias",
        fixture=GLM45_AIR,
        layout="tp2ep2",
        experts=TE_GROUPED,
        catches=("roundtrip", "mapping"),
        targets=("*.e_score_correction_bias", "*.router.expert_bias"),
    ),
    Mutant(
        name="glm45_mtp_qkv_from_last_decoder_layer",
        description="GLM-4.5 MTP source layer: the MTP layer's q/k/v are mapped to model.layers.{L - 1} (the last "
        "decoder layer) instead of model.layers.{L}",
        hook=_M + "glm45:mtp_qkv_from_last_decoder_layer",
        fixture=GLM45,
        layout="tp1",
        experts=TE_GROUPED,
        catches=("coverage", "roundtrip", "mapping"),
        targets=("*.layers.3.self_attn.*", "*.layers.4.self_attn.*", "mtp.layers.0.*", "decoder.layers.3.*"),
    ),
    Mutant(
        name="glm45_partial_rotary_lost",
        description="GLM-4.5 partial rotary: the provider rotates the whole head (rotary_percent 1.0, not 0.5)",
        hook=_M + "glm45:partial_rotary_lost",
        fixture=GLM45,
        layout="tp1",
        experts=TE_GROUPED,
        catches=("config", "logits"),
        targets=(
            *rule_targets("partial_rotary_factor+rope_parameters.partial_rotary_factor", "rotary_percent"),
            FORWARD,
        ),
    ),
)
