"""Catalog entries of Gemma 3 VL hazards (hooks in convcheck.mutants.gemma3_vl), on tiny:gemma3-vl at TP2 (the gate
case's layout: the projector's ColumnParallelLinear split over TP, the SigLIP tower whole on each rank).

Both are made identically in import and export (a roundtrip cannot see them), on the projector, where a transpose
and Gemma's zero-centred norms are the family's own hazards: the mapping oracle names the tensor and its first wrong
element. The image pass cannot (the pinned bridge's projector geometry, gemma3-vl-projector-geometry-fixed, stops it
on the tiny tower); text-only logits never reach the projector.
"""

from __future__ import annotations

from convcheck.mutants.mutant import HOOKS as _M
from convcheck.mutants.mutant import Mutant

GEMMA3_VL = "tiny:gemma3-vl"

GEMMA3_VL_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="g3vl_projector_reshaped",
        description="Gemma 3 VL's projector weight [V, H] imported as if stored [H, V] (reshaped where it must be "
        "transposed) and exported the inverse way",
        hook=_M + "gemma3_vl:projector_reshaped",
        fixture=GEMMA3_VL,
        layout="tp2",
        experts="auto",
        spec="te",
        catches=("mapping",),
        targets=("multi_modal_projector.proj.weight", "multi_modal_projector.mm_input_projection_weight"),
    ),
    Mutant(
        name="g3vl_soft_norm_negated",
        description="Gemma 3 VL's soft-embedding RMSNorm weight imported negated (1 - w for HF's 1 + w) and exported "
        "negated back",
        hook=_M + "gemma3_vl:soft_norm_negated",
        fixture=GEMMA3_VL,
        layout="tp2",
        experts="auto",
        spec="te",
        catches=("mapping",),
        targets=("multi_modal_projector.mm_soft_embed_norm.weight", "multi_modal_projector.mm_soft_emb_norm.weight"),
    ),
)
"""Planted Gemma 3 VL bugs: the projector's transpose confused with a reshape, the soft-token norm's sign."""
