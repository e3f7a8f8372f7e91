"""The mutant catalog `convcheck selftest` runs: each planted bug as plain data (hook, fixture, layout, catchers).

Adding a mutant: write its hook in a convcheck.mutants module (or anywhere importable), then add a `Mutant(...)`
to LAYOUT_MUTANTS or MODEL_MUTANTS. `catches` lists the oracles that must catch it; `targets` are fnmatch patterns
for every finding name it can cause (HF tensors, Megatron parameters, config labels; `logits` for a bug that changes
the forward), so that mutants sharing a launch get their own findings.

Entries live in catalog_layout (layout and naming bugs), catalog_model (experts, config, Mamba), catalog_te (the
Transformer Engine layout verify builds by default), catalog_te_families (Gemma 3 and MiniMax-M2, the TE-only
families), catalog_nemotron3 (Nemotron-3's MTP block), catalog_gemma4_vl (Gemma 4 VL's vision tower and embedder)
and catalog_engine (a trainer's sync into a real vLLM: senders and engine-side receivers the engine oracle catches,
run where the engine's environment exists); `Mutant` in convcheck.mutants.mutant.
"""

from __future__ import annotations

from convcheck.mutants.catalog_engine import ENGINE_MUTANTS
from convcheck.mutants.catalog_gemma3_vl import GEMMA3_VL_MUTANTS
from convcheck.mutants.catalog_gemma4_vl import GEMMA4_VL_MUTANTS
from convcheck.mutants.catalog_layout import LAYOUT_MUTANTS
from convcheck.mutants.catalog_model import MODEL_MUTANTS
from convcheck.mutants.catalog_nemotron3 import NEMOTRON3_MUTANTS
from convcheck.mutants.catalog_olmoe import OLMOE_MUTANTS
from convcheck.mutants.catalog_qwen3_vl import QWEN3_VL_MUTANTS
from convcheck.mutants.catalog_qwen35_vl import QWEN35_VL_MUTANTS
from convcheck.mutants.catalog_te import TE_MUTANTS
from convcheck.mutants.catalog_te_families import TE_FAMILY_MUTANTS
from convcheck.mutants.catalog_vpp import VPP_MUTANTS
from convcheck.mutants.mutant import FORWARD, Mutant

MUTANTS: tuple[Mutant, ...] = (*LAYOUT_MUTANTS, *MODEL_MUTANTS, *OLMOE_MUTANTS, *VPP_MUTANTS, *TE_MUTANTS,
                              *TE_FAMILY_MUTANTS, *ENGINE_MUTANTS, *QWEN3_VL_MUTANTS, *QWEN35_VL_MUTANTS,
                              *GEMMA3_VL_MUTANTS,
                              *NEMOTRON3_MUTANTS, *GEMMA4_VL_MUTANTS)  # fmt: skip
"""Every shipped mutant, in the order the kill matrix lists them."""

__all__ = ["FORWARD", "MUTANTS", "Mutant"]
