"""Qwen3-VL (Qwen3VLForConditionalGeneration) and Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration): a Qwen3 /
Qwen3-MoE language model under a ViT vision tower (Conv3d patch embedding, learned position embedding, LayerNorm
blocks with one fused qkv, a 2x2 patch merger and deepstack mergers whose features are added to the first language
layers' outputs); config tables, tiny fixtures and the bridge bugs convcheck names."""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.bridge03_bugs import (
    QWEN3_VL_HEAD_DIM_AS_PROVIDER_FIELD,
    QWEN3_VL_HEAD_DIM_AS_PROVIDER_FIELD_IMPORT,
)
from convcheck.models.fixture_spec import FixtureSpec
from convcheck.models.qwen3_vl_config import QWEN3_VL_MOE_TABLE, QWEN3_VL_TABLE
from convcheck.models.te_spec_bugs import QWEN3_VL_DTYPE_FROM_TEXT_CONFIG
from convcheck.models.upstream_bug import UpstreamBug

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 151, 150, 148, 149
"""The tiny vocabulary's last ids stand for `<|image_pad|>`, `<|video_pad|>`, `<|vision_start|>`, `<|vision_end|>`
(published: 151655, 151656, 151652, 151653, the last ids of a 151936 vocabulary's specials)."""

VISION: dict[str, Any] = {
    "depth": 4,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_heads": 2,
    "hidden_act": "gelu_pytorch_tanh",
    "in_channels": 3,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 32,
    "num_position_embeddings": 16,
    "deepstack_visual_indexes": [0, 1, 2],
}
"""Published vision towers (Qwen3-VL-2B: depth 24, hidden 1024, 16 heads, patch 16, merge 2, 2304 position
embeddings, deepstack [5, 11, 17]) shrunk: 4 blocks, three deepstack mergers after blocks 0-2 (the last block feeds
only the merger, as published), a 4x4 grid of position embeddings, 4-pixel patches; the merger's [64, 64] fc1 stays
within the distinct-value pool."""

TEXT: dict[str, Any] = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "vocab_size": 152,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 143,
    "eos_token_id": 145,
    "dtype": "bfloat16",
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 5000000.0,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}
"""Qwen3-VL-2B's language model (28 layers, hidden 2048, 16 heads / 8 KV, head_dim 128, mrope [24, 20, 20]
interleaved, theta 5e6) shrunk: 4 layers (three receive deepstack features), head_dim 8 with mrope [2, 1, 1]
(the published 3:2.5:2.5 split of the rotary half, rounded), the dtype repeated in text_config as published."""

TOKENS: dict[str, Any] = {
    "image_token_id": IMAGE_TOKEN,
    "video_token_id": VIDEO_TOKEN,
    "vision_start_token_id": VISION_START,
    "vision_end_token_id": VISION_END,
}

TINY_QWEN3_VL = FixtureSpec(
    name="qwen3-vl",
    config_class="Qwen3VLConfig",
    description="Qwen3-VL (published 2B / 4B structure): tied embeddings, 4-block vision tower, patch merger, "
    "3 deepstack mergers, interleaved mrope [2, 1, 1]; an image processor for 4-pixel patches",
    config={"text_config": TEXT, "vision_config": VISION, "tie_word_embeddings": True, **TOKENS},
)

TINY_QWEN3_VL_MOE = FixtureSpec(
    name="qwen3-vl-moe",
    config_class="Qwen3VLMoeConfig",
    description="Qwen3-VL-MoE (published 30B-A3B structure): untied, 8 experts top-2 stored fused, the same "
    "vision tower, merger and deepstack mergers as tiny:qwen3-vl",
    config={
        "text_config": {
            **{k: v for k, v in TEXT.items() if k != "intermediate_size"},
            "intermediate_size": 64,
            "moe_intermediate_size": 8,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
        "vision_config": VISION,
        "tie_word_embeddings": False,
        **TOKENS,
    },
    packed_experts=True,
    experts_transposed=True,
)
"""Published Qwen3-VL-MoE checkpoints store each layer's experts fused (`experts.gate_up_proj` [E, H, 2F],
`experts.down_proj` [E, F, H]), as transformers 5 holds them."""

CONFIG_EXPORT_FLAT = UpstreamBug(
    name="qwen3-vl-config-export-flat",
    summary="the Qwen3-VL bridges inherit the generic megatron_to_hf_config, which writes the language model's fields "
    "at the top level of the exported dict: Qwen3VLConfig / Qwen3VLMoeConfig read them from text_config and "
    "vision_config only, so the exported config describes transformers' default Qwen3-VL (32 layers, hidden 4096, "
    "vision depth 27, the default token ids), not the model converted",
    where="megatron/bridge/models/conversion/model_bridge.py:695-760 (megatron_to_hf_config, flat CONFIG_MAPPING); "
    "qwen_vl/qwen3_vl_bridge.py:36-112, :181-272 (no override, no vision fields)",
    findings=(("config", "* (megatron_to_hf_config)", "roundtrip-mismatch"),),
    seen_in=("0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen on tiny:qwen3-vl and tiny:qwen3-vl-moe: every text_config / vision_config field and the image / video token
ids come back as Qwen3VLConfig's defaults. Import, export of the weights and the forward are unaffected."""

MERGER_GELU_TANH = UpstreamBug(
    name="qwen3-vl-merger-gelu-tanh",
    summary="the bridge's Qwen3-VL patch merger and deepstack mergers apply the vision config's tanh-approximated "
    "GELU, where HF's Qwen3VLVisionPatchMerger applies exact (erf) GELU (nn.GELU()); only the vision blocks' MLPs "
    "use the tanh approximation (hidden_act gelu_pytorch_tanh): every image token's embedding and deepstack "
    "features differ (weights import, export and map right; text-only inputs are unaffected)",
    where="megatron/bridge/models/qwen_vl/modelling_qwen3_vl/utils.py:154 (activation_func from the vision config), "
    "transformer_config.py:113 (partial(F.gelu, approximate='tanh')); transformers models/qwen3_vl/"
    "modeling_qwen3_vl.py:121 (nn.GELU())",
    findings=(("logits", "logits[[]image[]]", "logits-differ"),),
    seen_in=("0.6.2",),
)
"""Seen on tiny:qwen3-vl at TP2: image logits differ by 8.2e-5 (relative 9.1e-5; text-only 1.2e-7), the image's greedy
tokens all equal; with the mergers' activation exact (tests/support/hooks_qwen3_vl.py:merger_gelu_exact) they agree to
1.8e-7. A changed greedy token on the image is not explained by it (the deepstack mutant's kill)."""

QWEN3_VL_BUGS = (
    MERGER_GELU_TANH,
    CONFIG_EXPORT_FLAT,
    QWEN3_VL_DTYPE_FROM_TEXT_CONFIG,
    QWEN3_VL_HEAD_DIM_AS_PROVIDER_FIELD,
    QWEN3_VL_HEAD_DIM_AS_PROVIDER_FIELD_IMPORT,
)
"""The known bugs of both Qwen3-VL architectures (dense and MoE language model)."""
QWEN3_VL = Architecture(
    hf_classes=("Qwen3VLForConditionalGeneration",),
    model_type="qwen3_vl",
    mapping_rules="convcheck.models.qwen3_vl_mappings:qwen3_vl_rules",
    config_rules=QWEN3_VL_TABLE,
    fixtures=(TINY_QWEN3_VL,),
    upstream_bugs=QWEN3_VL_BUGS,
)
QWEN3_VL_MOE = Architecture(
    hf_classes=("Qwen3VLMoeForConditionalGeneration",),
    model_type="qwen3_vl_moe",
    mapping_rules="convcheck.models.qwen3_vl_mappings:qwen3_vl_moe_rules",
    config_rules=QWEN3_VL_MOE_TABLE,
    fixtures=(TINY_QWEN3_VL_MOE,),
    upstream_bugs=QWEN3_VL_BUGS,
)
