"""Catalog entries of virtual-pipeline bugs (hooks in convcheck.mutants.vpp), on tiny:qwen2-tied-4l at PP2 x VPP2
(two chunks per rank: stage 0 holds layers 0 and 2, stage 1 layers 1 and 3 and the tied output layer).

A chunk numbered with chunk 0's offset loads and exports layers 0-1 twice and layers 2-3 never (coverage, roundtrip,
elements, layout and mapping name the tensors; the forward reads the wrong weights). The tied output layer synced
through the wrong chunk is left holding the pre-load sentinel: coverage names it, the mapping oracle its first
element, the logits the NaN forward.
"""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, Mutant
from convcheck.mutants.mutant import HOOKS as _M

TIED_4L, VPP2 = "tiny:qwen2-tied-4l", "pp2vpp2"

VPP_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="vpp_chunk_offset_from_chunk0",
        description="VPP layer numbering: every chunk's local layers get chunk 0's global offset (import and export)",
        hook=_M + "vpp:chunk_offset_from_chunk0",
        fixture=TIED_4L,
        layout=VPP2,
        catches=("coverage", "roundtrip", "elements", "layout", "mapping", "logits"),
        targets=("*.layers.*", FORWARD),
    ),
    Mutant(
        name="vpp_tied_output_wrong_chunk",
        description="VPP tied embeddings: the last stage's output-layer copy is synced into chunk 0, not its last",
        hook=_M + "vpp:tied_output_from_first_chunk",
        fixture=TIED_4L,
        layout=VPP2,
        catches=("coverage", "mapping", "logits"),
        targets=("output_layer.weight", FORWARD),
    ),
)
