"""Catalog entries of gated-DeltaNet bugs (Qwen3-Next, Qwen3.5): the GDN conv1d and in_proj splits, the zero-centered
gated norm, the gated-attention q/gate interleave and the per-layer schedule (hooks in convcheck.mutants.gdn).

Export-only bugs are named by roundtrip and layout (tensor, first wrong element, block diagnosis); the gated norm's
value bugs also by the differential, which compares its values against the declared map x + 1; the collapsed schedule
by the config oracle (linear_attention_freq) and logits.
"""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, QWEN3_NEXT, QWEN35, Mutant
from convcheck.mutants.mutant import HOOKS as _M

GDN_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="gdn_conv1d_not_deinterleaved",
        description="GDN conv1d not de-interleaved at TP2: the export concatenates each rank's [q k v] chunk as one "
        "block (HF conv1d [q0 k0 v0 q1 k1 v1] instead of [q0 q1 k0 k1 v0 v1])",
        hook=_M + "gdn:conv1d_not_deinterleaved",
        fixture=QWEN3_NEXT,
        layout="tp2",
        catches=("roundtrip", "layout"),
        targets=("*.layers.*.linear_attn.conv1d.weight", "<layout>"),
    ),
    Mutant(
        name="gdn_ba_swapped",
        description="GDN in_proj split: b and a trade places in the export (Qwen3-Next's in_proj_ba holds [a; b] "
        "per key head)",
        hook=_M + "gdn:ba_swapped_in_split",
        fixture=QWEN3_NEXT,
        layout="tp2",
        catches=("roundtrip", "layout"),
        targets=("*.layers.*.linear_attn.in_proj_ba.weight",),
    ),
    Mutant(
        name="gdn_norm_offset_twice",
        description="zero-centered gated norm: layer 2's export adds its +1 twice",
        hook=_M + "gdn:norm_offset_twice",
        fixture=QWEN3_NEXT,
        layout="tp2",
        catches=("roundtrip", "differential", "layout"),
        targets=("*.layers.2.linear_attn.norm.weight", "decoder.layers.2.self_attention.out_norm.weight"),
    ),
    Mutant(
        name="gdn_norm_elements_reversed",
        description="zero-centered gated norm: layer 1's export writes its elements in reverse order",
        hook=_M + "gdn:norm_elements_reversed",
        fixture=QWEN3_NEXT,
        layout="tp2",
        catches=("roundtrip", "differential", "layout"),
        targets=("*.layers.1.linear_attn.norm.weight", "decoder.layers.1.self_attention.out_norm.weight"),
    ),
    Mutant(
        name="gated_attention_gate_off_by_one_head",
        description="gated attention: the QKV export pairs head h's query with head h+1's output gate in q_proj",
        hook=_M + "gdn:gate_off_by_one_head",
        fixture=QWEN3_NEXT,
        layout="tp2",
        catches=("roundtrip", "layout"),
        targets=("*.layers.*.self_attn.q_proj.weight",),
    ),
    Mutant(
        name="gdn_schedule_as_interval",
        description="layer schedule collapsed: the provider gets full_attention_interval 4 instead of the per-layer "
        "layer_types [full, linear, linear, full]",
        hook=_M + "gdn:schedule_as_interval",
        fixture=QWEN3_NEXT,
        layout="tp2",
        catches=("config", "logits"),
        targets=("*",),
    ),
    Mutant(
        name="gdn_norm_offset_sign_flipped",
        description="zero-centered gated norm: import and export apply the offset with the wrong sign (Megatron "
        "holds HF + 1: a roundtrip sees only bf16 rounding)",
        hook=_M + "gdn:norm_offset_sign_flipped",
        fixture=QWEN35,
        layout="tp2",
        catches=("differential", "logits"),
        targets=("*.layers.*.linear_attn.norm.weight", "decoder.layers.*.self_attention.out_norm.weight", FORWARD),
    ),
)
