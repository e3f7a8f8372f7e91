"""Catalog entries of Qwen3.5-VL hazards (hooks in convcheck.mutants.qwen35_vl), on tiny:qwen3.5-vl-moe at TP2xEP2 (the
gate case's layout: GDN heads, gated attention, vision tower and merger split over TP, experts over EP).

The MTP input swap is made identically in import and export (a roundtrip cannot see it, and HF never runs the MTP
layer, so the logits cannot): the mapping oracle names eh_proj and its first wrong element. The reversed image tokens
change no weight: only the logits oracle's image pass sees it, the image's greedy tokens changing, which the known
merger GELU bug (qwen35-vl-merger-gelu-tanh: image logits within 5e-3, greedy tokens equal) does not explain.
"""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, Mutant
from convcheck.mutants.mutant import HOOKS as _M

QWEN35_VL_MOE = "tiny:qwen3.5-vl-moe"

QWEN35_VL_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="vl35_mtp_inputs_swapped",
        description="Qwen3.5-VL's MTP eh_proj [H, 2H] imported with its embedding / hidden halves exchanged and "
        "exported exchanged back",
        hook=_M + "qwen35_vl:mtp_inputs_swapped",
        fixture=QWEN35_VL_MOE,
        layout="tp2ep2",
        experts="auto",
        spec="te",
        catches=("mapping",),
        targets=("language_model.mtp.layers.0.eh_proj.weight", "mtp.fc.weight"),
    ),
    Mutant(
        name="vl35_image_tokens_reversed",
        description="Qwen3.5-VL's vision tower hands its merged image tokens to the language model in reverse order",
        hook=_M + "qwen35_vl:image_tokens_reversed",
        fixture=QWEN35_VL_MOE,
        layout="tp2ep2",
        experts="auto",
        spec="te",
        catches=("logits",),
        targets=(FORWARD,),
    ),
)
"""Planted Qwen3.5-VL bugs: MTP's two inputs swapped, the image tokens out of order."""
