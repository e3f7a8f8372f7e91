"""Catalog entries of virtual-pipeline and uneven-stage bugs (hooks in convcheck.mutants.vpp), on tiny:qwen2-tied-4l
at PP2 x VPP2 (two chunks per rank: stage 0 holds layers 0 and 2, stage 1 layers 1 and 3 and the tied output layer)
and at PP2 with stages of 1 + 3 layers.

A chunk numbered with chunk 0's offset loads and exports layers 0-1 twice and layers 2-3 never (coverage, roundtrip,
elements, layout and mapping name the tensors; the forward reads the wrong weights). The tied output layer synced
through the wrong chunk is left holding the pre-load sentinel: coverage names it, the mapping oracle its first
element, the logits the NaN forward. An uneven split numbered as if even puts stage 1's layers at 2-4: coverage names
the misplaced stage and the layer-4 parameters no HF tensor feeds, and the bridge's export crashes on the layer-4 name
no rank holds.
"""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, Mutant
from convcheck.mutants.mutant import HOOKS as _M

TIED_4L, VPP2, UNEVEN = "tiny:qwen2-tied-4l", "pp2vpp2", "pp2first1last3"

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
    Mutant(
        name="uneven_offset_as_even",
        description="uneven PP layer numbering: a stage offset is pp_rank x num_layers / pp, not the layers before it",
        hook=_M + "vpp:uneven_offset_as_even",
        fixture=TIED_4L,
        layout=UNEVEN,
        catches=("coverage", "roundtrip", "differential", "elements", "layout", "mapping", "logits"),
        targets=("*.layers.*", "<export>", FORWARD),
    ),
)
