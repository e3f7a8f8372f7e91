"""Catalog entries of Qwen3-VL hazards (hooks in convcheck.mutants.qwen3_vl), on tiny:qwen3-vl at TP2.

The merger transpose is made identically in import and export (a roundtrip cannot see it): the mapping oracle names
the tensor and its first wrong element. The unsplit vision qkv is made on import only: roundtrip and mapping name it.
The deepstack shift changes no weight: only the logits oracle's image pass sees it (text-only logits cannot: no image,
no deepstack features); the image's greedy tokens change, which the known merger GELU bug (qwen3-vl-merger-gelu-tanh:
image logits within 1e-4, greedy tokens equal) does not explain.
"""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, Mutant
from convcheck.mutants.mutant import HOOKS as _M

QWEN3_VL = "tiny:qwen3-vl"

QWEN3_VL_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="vl_merger_transposed",
        description="Qwen3-VL's patch merger linear_fc1 [4V, 4V] imported transposed and exported transposed back",
        hook=_M + "qwen3_vl:merger_transposed",
        fixture=QWEN3_VL,
        layout="tp2",
        experts="auto",
        spec="te",
        catches=("mapping",),
        targets=("vision_model.merger.linear_fc1.weight", "model.visual.merger.linear_fc1.weight"),
    ),
    Mutant(
        name="vl_vision_qkv_unsplit",
        description="Qwen3-VL vision block 0's qkv [q; k; v] imported as if already per-head [q_h; k_h; v_h]",
        hook=_M + "qwen3_vl:vision_qkv_unsplit",
        fixture=QWEN3_VL,
        layout="tp2",
        experts="auto",
        spec="te",
        catches=("roundtrip", "mapping"),
        targets=(
            "vision_model.decoder.layers.0.self_attention.linear_qkv.weight",
            "model.visual.blocks.0.attn.qkv.weight",
        ),
    ),
    Mutant(
        name="vl_deepstack_off_by_one",
        description="Qwen3-VL's language model adds deepstack feature k after layer k + 1 (the wrong LM layer)",
        hook=_M + "qwen3_vl:deepstack_off_by_one",
        fixture=QWEN3_VL,
        layout="tp2",
        experts="auto",
        spec="te",
        catches=("logits",),
        targets=(FORWARD,),
    ),
)
"""Planted Qwen3-VL bugs: the vision merger transposed, the vision qkv split wrongly, a deepstack index off by one."""
