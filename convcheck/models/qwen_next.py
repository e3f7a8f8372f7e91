"""Qwen3-Next and Qwen3.5 (dense and MoE text models): gated-DeltaNet / gated-attention hybrids with zero-centered
RMSNorms, an output gate packed in q_proj, partial RoPE, MoE with a gated shared expert, and one MTP layer.

The bridges (megatron-bridge 0.6.2 qwen/qwen3_next_bridge.py, qwen/qwen35_bridge.py) build them as a GPTModel with
megatron-core's experimental-attention block spec: a GatedDeltaNet or a gated SelfAttention per layer, from
`layer_types`. Qwen3-Next stores the GDN input projection as two fused tensors (in_proj_qkvz, in_proj_ba), Qwen3.5 as
four (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a).
"""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.bridge_wide import QUANT_MAPPING_NOT_IMPLEMENTED
from convcheck.models.fixture_spec import FixtureSpec, engine_variant
from convcheck.models.qwen_next_config import (
    GDN_CONFIG_EXPORT_LOSES_SCHEDULE,
    QWEN3_NEXT_TABLE,
    QWEN35_MOE_TABLE,
    QWEN35_TABLE,
)
from convcheck.models.upstream_bug import UpstreamBug

LAYER_TYPES = ["full_attention", "linear_attention", "linear_attention", "full_attention"]
"""A per-layer schedule no `full_attention_interval` gives (layer 0 is full attention), ending with a full-attention
layer: the bridge builds the MTP layer from the last decoder layer's spec (gpt_provider.py:373), and published
checkpoints hold an attention MTP layer."""

GDN_SHAPES: dict[str, Any] = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_hidden_layers": 4,
    "layer_types": LAYER_TYPES,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "vocab_size": 152,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
"""Two key heads and four value heads (two per key head) so TP2 splits both; partial rotary 0.25 as published."""

MOE_SHAPES: dict[str, Any] = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
}
"""Eight routed experts (EP2 and TP2xEP2 legal), a shared expert of its own width and its [1, H] gate."""

GATED_NORM = ("linear_attn.norm.weight",)
"""The GDN output norm: a plain-scale RMSNorm in HF (Qwen3NextRMSNormGated, ones at init), zero-centered in Megatron."""


def gdn_spec(name: str, config_class: str, description: str, config: dict[str, Any], **extra: Any) -> FixtureSpec:
    """A GDN fixture: one MTP layer stored as `mtp.*`, the gated norm drawn near one, `extra` on top."""
    return FixtureSpec(name=name, config_class=config_class, description=description, config=config, mtp_layers=1,
                       mtp_style="qwen", near_one_tensors=GATED_NORM, **extra)  # fmt: skip


TINY_QWEN3_NEXT = gdn_spec(
    name="qwen3-next",
    config_class="Qwen3NextConfig",
    description="Qwen3-Next: gated DeltaNet + gated attention (schedule full, linear, linear, full), 8 routed + 1 "
    "gated shared expert, partial RoPE, 1 MTP layer; fused in_proj_qkvz / in_proj_ba",
    config={**GDN_SHAPES, **MOE_SHAPES, "num_nextn_predict_layers": 1},
)

TINY_QWEN3_NEXT_VLLM = engine_variant(
    TINY_QWEN3_NEXT,
    "tiny:qwen3-next with hidden 64, head_dim 32, DeltaNet key / value heads 128 wide and expert widths 32, which CPU "
    "vLLM's kernels accept (its chunked gated delta rule takes head dim 128)",
    hidden_size=64,
    head_dim=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
)

TINY_QWEN35 = gdn_spec(
    name="qwen3.5",
    config_class="Qwen3_5TextConfig",
    description="Qwen3.5 dense text model: gated DeltaNet + gated attention (full, linear, linear, full), partial "
    "RoPE, 1 MTP layer; separate in_proj_qkv / z / b / a",
    config={**GDN_SHAPES, "intermediate_size": 64, "mtp_num_hidden_layers": 1},
)

TINY_QWEN35_MOE = gdn_spec(
    name="qwen3.5-moe",
    config_class="Qwen3_5MoeTextConfig",
    description="Qwen3.5-MoE text model: gated DeltaNet + gated attention (full, linear, linear, full), 8 routed + 1 "
    "gated shared expert, 1 MTP layer; per-expert tensors as save_pretrained writes them",
    config={**GDN_SHAPES, **MOE_SHAPES, "mtp_num_hidden_layers": 1},
)

TINY_QWEN36_MOE = gdn_spec(
    name="qwen3.6-moe",
    config_class="Qwen3_5MoeTextConfig",
    description="Qwen3.6-MoE (Qwen3.5-MoE's text model) as published: routed experts stored fused "
    "(experts.gate_up_proj / down_proj) in the decoder and the MTP layer; expert width 8, so a fused [8, 16, 32] "
    "tensor still holds distinct values",
    config={**GDN_SHAPES, **MOE_SHAPES, "moe_intermediate_size": 8, "mtp_num_hidden_layers": 1},
    packed_experts=True,
)


MTP_SEQUENTIAL_EXPERTS_UNMAPPED = UpstreamBug(
    name="qwen35-moe-mtp-sequential-experts-unmapped",
    summary="the Qwen3.5-MoE bridge maps the MTP layer's routed experts only in the grouped layout "
    "(experts.linear_fc*.weight*), not as SequentialMLP local_experts (what moe_grouped_gemm=False or a build "
    "without TE gives; its decoder layers have both); the unmapped parameters leave empty conversion tasks "
    "on which load_hf_weights and export_hf_weights crash",
    where="megatron/bridge/models/qwen/qwen35_bridge.py:377-390 (_get_moe_mtp_mappings); the crash at "
    "conversion/model_bridge.py:1100 (load) and :1340 (export)",
    findings=(("coverage", "mtp.layers.*.mtp_model_layer.mlp.experts.local_experts.*.linear_fc*.weight", "unmapped"),),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
    ),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Every other finding of such a run follows from the two crashes (nothing is loaded or exported)."""

SEQUENTIAL_EXPERTS_UNMAPPED = UpstreamBug(
    name="gdn-moe-sequential-experts-unmapped",
    summary="the Qwen3-Next and Qwen3.5-MoE bridges map the decoder's routed experts only in the grouped layout, not "
    "as SequentialMLP local_experts; load_hf_weights and export_hf_weights crash on the empty conversion tasks",
    where="megatron/bridge/models/qwen/qwen3_next_bridge.py, qwen35_bridge.py (0.5.0: no local_experts mapping)",
    findings=(("coverage", "decoder.layers.*.mlp.experts.local_experts.*.linear_fc*.weight", "unmapped"),),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
    ),
    seen_in=("0.5.0",),
    fixed_in="0.5.1 (its Sequential (non-grouped) experts mappings; on main: #4499, bf5163a59)",
)

SCHEDULE_COLLAPSED = UpstreamBug(
    name="gdn-schedule-collapsed-to-interval",
    summary="full_attention_interval_from_hf turns layer_types into one interval (the first full-attention layer's "
    "index + 1), so a schedule no interval gives is built with GDN and attention on the wrong layers",
    where="megatron/bridge/models/conversion/transformers_compat.py:213-223 (0.5.x)",
    findings=(("config", "layer_types -> linear_attention_freq", "mismatch"),),
    seen_in=("0.5.0", "0.5.1"),
    fixed_in="0.6.0 (#4790, 2f69b0677: the per-layer list, transformers_compat.py:217-223)",
)

READS_FULL_ATTENTION_INTERVAL = UpstreamBug(
    name="qwen3-next-reads-full-attention-interval",
    summary="the Qwen3-Next provider reads hf_config.full_attention_interval, which Qwen3NextConfig no longer keeps "
    "(transformers turns it into layer_types): building the provider raises AttributeError",
    where="megatron/bridge/models/qwen/qwen3_next_bridge.py:85 (0.4.x; :80 in 0.3.x)",
    findings=(("*", "<build>", "build-failed"),),
    message_contains="full_attention_interval",
    seen_in=("0.3.0", "0.3.1", "0.4.0", "0.4.1", "0.4.2"),
    fixed_in="0.5.0 (#3609, 270536cce: full_attention_interval_from_hf)",
)

PER_EXPERT_CHECKPOINT_NOT_READ = UpstreamBug(
    name="qwen35-moe-per-expert-checkpoint-not-read",
    summary="with grouped experts (the TE spec's moe_grouped_gemm, what production trains) the 0.5.x Qwen3.5-MoE "
    "bridges map the routed experts only to the fused experts.gate_up_proj / down_proj, while a checkpoint holds "
    "them per expert (experts.N.gate_proj.weight, as transformers 5.8.1's save_pretrained writes): the import raises "
    "KeyError and loads nothing, and the export writes fused tensors the checkpoint does not have",
    where="megatron/bridge/models/qwen/qwen35_bridge.py:236-244 (0.5.0), :234-244 (0.5.1; the per-expert mappings "
    "at :245-256 serve SequentialMLP only)",
    findings=(
        ("*", "*mlp.experts.*.*_proj.weight", "not-exported"),
        ("*", "*mlp.experts.*.*_proj.weight", "missing"),
        ("*", "*mlp.experts.*.*_proj.weight", "never-written"),
        ("*", "*mlp.experts.gate_up_proj", "unexpected"),
        ("*", "*mlp.experts.down_proj", "unexpected"),
    ),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("coverage", "*", "not-loaded"),
        ("mapping", "*", "import-bytes-differ"),
        ("roundtrip", "*", "bytes-differ"),
        ("layout", "*", "tp1-differs-from-source"),
        ("logits", "logits", "logits-differ"),
        ("logits", "greedy-tokens", "greedy-differs"),
    ),
    seen_in=("0.5.0", "0.5.1"),
)
"""Seen by `convcheck support` on bridge 0.5.1 (Qwen3_5MoeForCausalLM and Qwen3_5MoeForConditionalGeneration written
by transformers 5.8.1), every finding of the import that never ran following it."""

QWEN35_MOE = Architecture(
    hf_classes=("Qwen3_5MoeForCausalLM",),
    model_type="qwen3_5_moe_text",
    mapping_rules="convcheck.models.qwen_next_mappings:qwen35_rules",
    config_rules=QWEN35_MOE_TABLE,
    fixtures=(TINY_QWEN35_MOE, TINY_QWEN36_MOE),
    upstream_bugs=(
        MTP_SEQUENTIAL_EXPERTS_UNMAPPED,
        PER_EXPERT_CHECKPOINT_NOT_READ,
        GDN_CONFIG_EXPORT_LOSES_SCHEDULE,
        SCHEDULE_COLLAPSED,
        SEQUENTIAL_EXPERTS_UNMAPPED,
        QUANT_MAPPING_NOT_IMPLEMENTED,
    ),
)

QWEN3_NEXT = Architecture(
    hf_classes=("Qwen3NextForCausalLM",),
    model_type="qwen3_next",
    mapping_rules="convcheck.models.qwen_next_mappings:qwen3_next_rules",
    config_rules=QWEN3_NEXT_TABLE,
    fixtures=(TINY_QWEN3_NEXT, TINY_QWEN3_NEXT_VLLM),
    upstream_bugs=(
        GDN_CONFIG_EXPORT_LOSES_SCHEDULE,
        SCHEDULE_COLLAPSED,
        SEQUENTIAL_EXPERTS_UNMAPPED,
        READS_FULL_ATTENTION_INTERVAL,
        QUANT_MAPPING_NOT_IMPLEMENTED,
    ),
)

QWEN35 = Architecture(
    hf_classes=("Qwen3_5ForCausalLM",),
    model_type="qwen3_5_text",
    mapping_rules="convcheck.models.qwen_next_mappings:qwen35_rules",
    config_rules=QWEN35_TABLE,
    fixtures=(TINY_QWEN35,),
    upstream_bugs=(GDN_CONFIG_EXPORT_LOSES_SCHEDULE, SCHEDULE_COLLAPSED, QUANT_MAPPING_NOT_IMPLEMENTED),
)
