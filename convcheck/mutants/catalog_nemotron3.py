"""Catalog entries for Nemotron-3's MTP block (tiny:nemotron-3-mtp, the Transformer Engine layout the bridge maps its
MTP norms in): planted through the real NemotronHBridge's MTP flattening (convcheck.mutants.nemotron3)."""

from __future__ import annotations

from convcheck.mutants.mutant import HOOKS as _M
from convcheck.mutants.mutant import Mutant

NEMOTRON_3 = "tiny:nemotron-3-mtp"

NEMOTRON3_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="nemotron_mtp_enorm_hnorm_swapped",
        description="Nemotron-3 MTP block's enorm and hnorm swapped (import and export alike): the embedding is "
        "normed with the hidden state's weights and back",
        hook=_M + "nemotron3:mtp_enorm_hnorm_swapped",
        fixture=NEMOTRON_3,
        layout="tp2",
        experts="auto",
        spec="te",
        catches=("mapping",),
        targets=("mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight"),
    ),
    Mutant(
        name="nemotron_mtp_norm_from_other_layer",
        description="Nemotron-3 MTP inner layers' pre-norms from the wrong layer: the flattened MTP index reversed, "
        "the attention layer's norm is the MoE layer's and back (import and export alike)",
        hook=_M + "nemotron3:mtp_inner_norms_from_the_other_layer",
        fixture=NEMOTRON_3,
        layout="tp2",
        experts="auto",
        spec="te",
        catches=("mapping",),
        targets=(
            "mtp.layers.0.norm.weight",
            "mtp.layers.1.norm.weight",
            "mtp.layers.0.mtp_model_layer.layers.0.self_attention.linear_qkv.layer_norm_weight",
            "mtp.layers.0.mtp_model_layer.layers.1.pre_mlp_layernorm.weight",
        ),
    ),
)
