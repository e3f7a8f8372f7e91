"""Catalog entries of Gemma 4 VL hazards (hooks in convcheck.mutants.gemma4_vl), on tiny:gemma4-vl at TP2 (the gate
case's layout).

Both are made identically in import and export (a roundtrip cannot see them) on tensors the bridge maps whole from
transformers' own modules: the mapping oracle names the tensor and its first wrong element. The logits oracle cannot
tell them apart on this fixture while gemma4-shared-kv-null-global-kv-heads leaves its logits NaN.
"""

from __future__ import annotations

from convcheck.mutants.mutant import HOOKS as _M
from convcheck.mutants.mutant import Mutant

GEMMA4_VL = "tiny:gemma4-vl"

GEMMA4_VL_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="g4vl_position_tables_swapped",
        description="Gemma 4 VL's vision position table [2, N, V] imported with its x and y tables exchanged and "
        "exported exchanged back",
        hook=_M + "gemma4_vl:position_tables_swapped",
        fixture=GEMMA4_VL,
        layout="tp2",
        experts="auto",
        spec="te",
        catches=("mapping",),
        targets=(
            "vision_tower.patch_embedder.position_embedding_table",
            "model.vision_tower.patch_embedder.position_embedding_table",
        ),
    ),
    Mutant(
        name="g4vl_vision_projection_transposed",
        description="Gemma 4 VL's vision embedder projection [H, V] imported in the transposed storage order and "
        "exported back",
        hook=_M + "gemma4_vl:vision_projection_transposed",
        fixture=GEMMA4_VL,
        layout="tp2",
        experts="auto",
        spec="te",
        catches=("mapping",),
        targets=("embed_vision.embedding_projection.weight", "model.embed_vision.embedding_projection.weight"),
    ),
)
"""Planted Gemma 4 VL bugs: the vision position tables exchanged, the vision projection transposed."""
