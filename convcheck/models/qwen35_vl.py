"""Qwen3.5-VL (Qwen3_5ForConditionalGeneration) and Qwen3.5-VL-MoE (Qwen3_5MoeForConditionalGeneration): the
Qwen3.5 gated-DeltaNet / gated-attention language model (convcheck.models.qwen_next) under the Qwen3-VL vision tower
without deepstack mergers (convcheck.models.qwen3_vl); config tables, tiny fixtures and the bridge bugs convcheck
names.

megatron-bridge 0.6.2 builds both as a Qwen3VLModel (qwen_vl/qwen35_vl_bridge.py, qwen35_vl_provider.py): the
language model from megatron-core's experimental-attention block spec (GDN or gated attention per `layer_types`, the
attention layers' class swapped for Qwen3VLSelfAttention's mrope), the vision tower from TE classes. Published
checkpoints keep the MTP layer at the top level (`mtp.*`), beside `model.language_model.*` and `model.visual.*`.
"""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.bridge_wide import QUANT_MAPPING_NOT_IMPLEMENTED
from convcheck.models.fixture_spec import FixtureSpec
from convcheck.models.qwen3_vl import VISION as QWEN3_VL_VISION
from convcheck.models.qwen35_vl_config import QWEN35_VL_MOE_TABLE, QWEN35_VL_TABLE
from convcheck.models.qwen_next import MOE_SHAPES, PER_EXPERT_CHECKPOINT_NOT_READ, gdn_spec
from convcheck.models.upstream_bug import UpstreamBug

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 150, 151, 148, 149
"""The tiny vocabulary's last ids, in the published order (Qwen3.5: `<|vision_start|>` 248053, `<|vision_end|>`
248054, `<|image_pad|>` 248056, `<|video_pad|>` 248057)."""

VISION: dict[str, Any] = {
    **{k: v for k, v in QWEN3_VL_VISION.items() if k != "deepstack_visual_indexes"},
    "depth": 2,
    "out_hidden_size": 32,
}
"""Published Qwen3.5 vision towers (27B / 35B-A3B: depth 27, hidden 1152, 16 heads, patch 16, merge 2, 2304
position embeddings, gelu_pytorch_tanh, no deepstack mergers: Qwen3_5VisionConfig has no deepstack_visual_indexes)
shrunk as tiny:qwen3-vl's (hidden 16, 2 heads, 4-pixel patches, a 4x4 position grid), 2 blocks."""

SCHEDULE = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
"""The published layer schedule (three gated-DeltaNet layers, then one gated-attention layer) once: the MTP layer
copies the last, full-attention, layer."""

TEXT: dict[str, Any] = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 4,
    "layer_types": SCHEDULE,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 64,
    "vocab_size": 152,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 143,
    "eos_token_id": 145,
    "mtp_num_hidden_layers": 1,
    "dtype": "bfloat16",
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}
"""Qwen3.5's language model (27B: 64 layers, hidden 5120, 24 heads / 4 KV of 256, GDN 16 key / 48 value heads of
128, mrope [11, 11, 10] interleaved on a 0.25 rotary share, theta 1e7, one MTP layer) shrunk: 4 layers, head_dim 16
with rotary share 0.5 (8 rotary channels, so the t / h / w split [2, 1, 1] keeps three non-empty sections; a bridge
that kept its 0.25 default would rotate half of them), two key / four value GDN heads, the dtype repeated in
text_config as published."""

TOKENS: dict[str, Any] = {
    "image_token_id": IMAGE_TOKEN,
    "video_token_id": VIDEO_TOKEN,
    "vision_start_token_id": VISION_START,
    "vision_end_token_id": VISION_END,
}


def vl_spec(name: str, config_class: str, description: str, text: dict[str, Any], tied: bool,
            **extra: Any) -> FixtureSpec:  # fmt: skip
    """A Qwen3.5-VL fixture of `text` under the vision tower: a GDN fixture (one MTP layer stored as `mtp.*`, the gated
    norm drawn near one)."""
    config = {"text_config": text, "vision_config": VISION, "tie_word_embeddings": tied, **TOKENS}
    return gdn_spec(name, config_class, description, config, **extra)


TINY_QWEN35_VL = vl_spec(
    name="qwen3.5-vl",
    config_class="Qwen3_5Config",
    description="Qwen3.5-VL dense (published 2B / 4B structure): tied embeddings, GDN x3 + gated attention, "
    "interleaved mrope [2, 1, 1] on a partial rotary share, 1 MTP layer, 2-block vision tower and patch merger (no "
    "deepstack)",
    text=TEXT,
    tied=True,
)

TINY_QWEN35_VL_MOE = vl_spec(
    name="qwen3.5-vl-moe",
    config_class="Qwen3_5MoeConfig",
    description="Qwen3.5-VL-MoE (published 35B-A3B structure): untied, 8 routed experts top-2 stored fused + 1 gated "
    "shared expert in every layer and the MTP layer, the same vision tower as tiny:qwen3.5-vl",
    text={
        **{k: v for k, v in TEXT.items() if k != "intermediate_size"},
        **MOE_SHAPES,
        "moe_intermediate_size": 8,
    },
    tied=False,
    packed_experts=True,
)
"""Routed experts fused as transformers 5 holds them (`experts.gate_up_proj` [E, 2F, H], `experts.down_proj`
[E, H, F]), in the decoder and the MTP layer, as published Qwen3.6-35B-A3B checkpoints store them; expert width 8 keeps
a fused [8, 16, 32] tensor within the distinct-value pool."""

CONFIG_EXPORT_FLAT = UpstreamBug(
    name="qwen35-vl-config-export-flat",
    summary="the Qwen3.5-VL bridges inherit the generic megatron_to_hf_config, which writes the language model's "
    "fields at the top level of the exported dict: Qwen3_5Config / Qwen3_5MoeConfig read them from text_config and "
    "vision_config only, so the exported config describes transformers' default Qwen3.5 (32 layers, hidden 4096, "
    "vision depth 27, rope theta 1e4, the default token ids), not the model converted",
    where="megatron/bridge/models/conversion/model_bridge.py:695-760 (megatron_to_hf_config, flat CONFIG_MAPPING); "
    "qwen_vl/qwen35_vl_bridge.py:139-353 (no override, no vision fields); 0.5.x: model_bridge.py:670-741, "
    "qwen35_vl_bridge.py:143-349",
    findings=(("config", "* (megatron_to_hf_config)", "roundtrip-mismatch"),),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen on tiny:qwen3.5-vl and tiny:qwen3.5-vl-moe: every text_config / vision_config field and the image / video token
ids come back as the config class's defaults (qwen3-vl-config-export-flat's twin). Import, export of the weights and
the forward are unaffected."""

MERGER_GELU_TANH = UpstreamBug(
    name="qwen35-vl-merger-gelu-tanh",
    summary="the bridge's Qwen3.5-VL patch merger (Qwen3-VL's Qwen3VLVisionPatchMerger) applies the vision config's "
    "tanh-approximated GELU, where HF's Qwen3_5VisionPatchMerger applies exact (erf) GELU (nn.GELU()); only the "
    "vision blocks' MLPs use the tanh approximation (hidden_act gelu_pytorch_tanh): every image token's embedding "
    "differs (weights import, export and map right; text-only inputs are unaffected)",
    where="megatron/bridge/models/qwen_vl/modelling_qwen3_vl/utils.py:154 (activation_func from the vision config), "
    "transformer_config.py:113 (partial(F.gelu, approximate='tanh')); transformers models/qwen3_5/"
    "modeling_qwen3_5.py:881, qwen3_5_moe/modeling_qwen3_5_moe.py:971 (nn.GELU()); 0.5.x: utils.py:154, "
    "transformer_config.py:111, transformers 5.8.1 modeling_qwen3_5.py:866, modeling_qwen3_5_moe.py:959",
    findings=(("logits", "logits[[]image[]]", "logits-differ"),),
    seen_in=("0.5.0", "0.5.1", "0.6.2"),
)
"""qwen3-vl-merger-gelu-tanh's twin. Seen on tiny:qwen3.5-vl at TP1: image logits differ by 2.9e-3 (relative 5.7e-4;
text-only 7.4e-6), the image's greedy tokens all equal; with the merger's activation exact
(tests/support/hooks_qwen3_vl.py:merger_gelu_exact) they agree to 4.3e-5 (relative 8.5e-6)."""

VISION_READS_DEEPSTACK = UpstreamBug(
    name="qwen35-vl-vision-reads-deepstack-indexes",
    summary="the Qwen3.5-VL providers build their vision tower with Qwen3-VL's get_vision_model_config, which reads "
    "hf_config.deepstack_visual_indexes unguarded: Qwen3_5VisionConfig / Qwen3_5MoeVisionConfig declare no such "
    "field (Qwen3.5 has no deepstack mergers), so building any Qwen3.5-VL model whose config.json does not carry "
    "the Qwen3-VL field raises AttributeError",
    where="megatron/bridge/models/qwen_vl/modelling_qwen3_vl/transformer_config.py:99 (0.4.x), called from "
    "modelling_qwen3_vl/model.py:140; transformers 5.3.0 models/qwen3_5/configuration_qwen3_5.py:204-231 (no field)",
    findings=(("*", "<build>", "build-failed"),),
    seen_in=("0.4.0", "0.4.1", "0.4.2"),
    fixed_in="0.5.0 (getattr with an empty default, transformer_config.py:107)",
    message_contains="deepstack_visual_indexes",
)
"""Seen on tiny:qwen3.5-vl and tiny:qwen3.5-vl-moe (configs as transformers 5.12.1 writes them): every oracle stops at
`<build> [build-failed]` naming the missing attribute."""

MTP_SEQUENTIAL_EXPERTS_UNMAPPED = UpstreamBug(
    name="qwen35-vl-moe-mtp-sequential-experts-unmapped",
    summary="the Qwen3.5-VL-MoE bridge takes its MTP mappings from the Qwen3.5-MoE bridge, which maps the MTP "
    "layer's routed experts only in the grouped layout (experts.linear_fc*.weight*), not as SequentialMLP "
    "local_experts (what moe_grouped_gemm=False gives): the unmapped parameters leave empty conversion tasks on "
    "which load_hf_weights and export_hf_weights crash (qwen35-moe-mtp-sequential-experts-unmapped's twin)",
    where="megatron/bridge/models/qwen_vl/qwen35_vl_bridge.py:263 (Qwen35MoEBridge._get_moe_mtp_mappings); "
    "qwen/qwen35_bridge.py:363-390; the crash at conversion/model_bridge.py:1100 (load) and :1340 (export)",
    findings=(
        (
            "coverage",
            "language_model.mtp.layers.*.mtp_model_layer.mlp.experts.local_experts.*.linear_fc*.weight",
            "unmapped",
        ),
    ),
    consequences=(
        ("*", "<import>", "import-failed"),
        ("*", "<export>", "export-failed"),
    ),
    seen_in=("0.6.2",),
)
"""Seen on tiny:qwen3.5-vl-moe at EP2 with `--experts sequential`: every other finding of that run follows from the
crashes (nothing past the failing task is loaded, the image and text logits are NaN). The provider asks for grouped
experts (moe_grouped_gemm), which `--experts auto` builds."""

QWEN35_VL = Architecture(
    hf_classes=("Qwen3_5ForConditionalGeneration",),
    model_type="qwen3_5",
    mapping_rules="convcheck.models.qwen35_vl_mappings:qwen35_vl_rules",
    config_rules=QWEN35_VL_TABLE,
    fixtures=(TINY_QWEN35_VL,),
    upstream_bugs=(MERGER_GELU_TANH, CONFIG_EXPORT_FLAT, VISION_READS_DEEPSTACK, QUANT_MAPPING_NOT_IMPLEMENTED),
)
QWEN35_VL_MOE = Architecture(
    hf_classes=("Qwen3_5MoeForConditionalGeneration",),
    model_type="qwen3_5_moe",
    mapping_rules="convcheck.models.qwen35_vl_mappings:qwen35_vl_rules",
    config_rules=QWEN35_VL_MOE_TABLE,
    fixtures=(TINY_QWEN35_VL_MOE,),
    upstream_bugs=(
        MERGER_GELU_TANH,
        CONFIG_EXPORT_FLAT,
        VISION_READS_DEEPSTACK,
        MTP_SEQUENTIAL_EXPERTS_UNMAPPED,
        PER_EXPERT_CHECKPOINT_NOT_READ,
        QUANT_MAPPING_NOT_IMPLEMENTED,
    ),
)
