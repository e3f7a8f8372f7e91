"""Catalog entries of GPT-OSS bugs (hooks in convcheck.mutants.gpt_oss): the interleaved gate/up rows and their bias,
a square down_proj's orientation, and the sinks over TP.

The interleave and orientation bugs are symmetric (the export undoes the import), so a roundtrip stays bitwise: the
mapping oracle names each expert parameter against the fused HF slice, and the logits differ. The sinks bug is
import-only: the roundtrip names the sinks too.
"""

from __future__ import annotations

from convcheck.mutants.mutant import FORWARD, Mutant
from convcheck.mutants.mutant import HOOKS as _M

GPT_OSS, GPT_OSS_SQUARE = "tiny:gpt-oss", "tiny:gpt-oss-square"
FC1 = "decoder.layers.*.mlp.experts.local_experts.*.linear_fc1."
FC2 = "decoder.layers.*.mlp.experts.local_experts.*.linear_fc2.weight"

GPT_OSS_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="gpt_oss_gate_up_halves",
        description="GPT-OSS gate_up_proj (and its bias) read as [gate half | up half] instead of alternating "
        "columns, on import and export alike",
        hook=_M + "gpt_oss:gate_up_halves",
        fixture=GPT_OSS,
        layout="ep2",
        catches=("mapping", "logits"),
        targets=(FC1 + "weight", FC1 + "bias", "*.layers.*.mlp.experts.gate_up_proj*", FORWARD),
    ),
    Mutant(
        name="gpt_oss_bias_not_interleaved",
        description="GPT-OSS gate_up_proj_bias not de-interleaved (the weight is), on import and export alike",
        hook=_M + "gpt_oss:bias_not_interleaved",
        fixture=GPT_OSS,
        layout="ep2",
        catches=("mapping", "logits"),
        targets=(FC1 + "bias", "*.layers.*.mlp.experts.gate_up_proj_bias", FORWARD),
    ),
    Mutant(
        name="gpt_oss_down_proj_not_transposed",
        description="GPT-OSS square down_proj neither transposed on import nor on export (the bug #3743 fixed)",
        hook=_M + "gpt_oss:down_proj_not_transposed",
        fixture=GPT_OSS_SQUARE,
        layout="ep2",
        catches=("mapping", "logits"),
        targets=(FC2, "*.layers.*.mlp.experts.down_proj", FORWARD),
    ),
    Mutant(
        name="gpt_oss_sinks_not_split",
        description="GPT-OSS attention sinks not split over TP: every TP rank loads rank 0's heads' sinks",
        hook=_M + "gpt_oss:sinks_not_split",
        fixture=GPT_OSS,
        layout="tp2",
        catches=("roundtrip", "mapping", "logits"),
        targets=(
            "decoder.layers.*.self_attention.core_attention.softmax_offset",
            "*.layers.*.self_attn.sinks",
            "<layout>",
            FORWARD,
        ),
    ),
    Mutant(
        name="gpt_oss_window_off_by_one",
        description="GPT-OSS sliding window one key too wide: window_size (W, 0) instead of (W - 1, 0) (#2656)",
        hook=_M + "gpt_oss:window_off_by_one",
        fixture=GPT_OSS,
        layout="tp2",
        catches=("config", "logits"),
        targets=("sliding_window -> window_size", FORWARD),
    ),
)
