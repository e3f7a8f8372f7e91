"""Gemma 4 vision-language (Gemma4ForConditionalGeneration, model_type gemma4): the Gemma 4 text model
(convcheck.models.gemma4) under Gemma 4's own vision tower (a patch embedder with a learned 2-D position table, RMSNorm
blocks with q / k / v norms and 2-D RoPE, clipped linears, a k x k average pooler scaling by sqrt(hidden)) and its
multimodal embedder (a scaleless RMSNorm, then one projection to the text width), and, on E2B / E4B, an audio tower
(a conformer) with its own embedder; config table, tiny fixture and the bridge bugs convcheck names.

megatron-bridge 0.6.2 builds it as Gemma4VLModel (gemma_vl/gemma4_vl_bridge.py, gemma4_vl_provider.py,
modeling_gemma4_vl.py): the language model from the Gemma 4 text providers (the dense variant on the bridge's own
local layer spec), the vision tower, the audio tower and both embedders as transformers' own modules
(AutoModel.from_config, Gemma4MultimodalEmbedder), mapped whole (`vision_tower.**`, `embed_vision.**`,
`audio_tower.**`, `embed_audio.**`, ReplicatedMapping). Published checkpoints hold `model.language_model.*`,
`model.vision_tower.*`, `model.embed_vision.*` and, on E2B / E4B, `model.audio_tower.*`, `model.embed_audio.*`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.fixture_spec import FixtureSpec
from convcheck.models.gemma4 import DENSE_PP_REFUSED, SHARED_KV_K_NORM_UNMAPPED, TINY_GEMMA4
from convcheck.models.gemma4_05_bugs import CONFIG_EXPORT_GENERIC, MOE_FUSED_WEIGHTS, MOE_LAYER_UNPATCHED
from convcheck.models.gemma4_moe import MOE_POST_LAYERNORM_DEFAULT_EPS, TINY_GEMMA4_MOE
from convcheck.models.gemma4_vl_config import GEMMA4_VL_TABLE
from convcheck.models.upstream_bug import BUILD_FAILED, UpstreamBug

BOI, BOA, IMAGE_TOKEN, AUDIO_TOKEN, EOI, EOA, VIDEO_TOKEN = 121, 122, 123, 124, 125, 126, 127
"""The tiny vocabulary's last ids, in the published order (`<|image>` 255999, `<|audio>` 256000, `<|image|>` 258880,
`<|audio|>` 258881, `<image|>` 258882, `<audio|>` 258883, `<|video|>` 258884 of a 262144 vocabulary)."""

TEXT: dict[str, Any] = {
    **TINY_GEMMA4.config,
    "attention_k_eq_v": False,
    "num_global_key_value_heads": None,
    "use_double_wide_mlp": False,
    "use_bidirectional_attention": None,
    "dtype": "bfloat16",
}
"""E4B's language model (42 layers as (5 sliding, 1 full) x7, window 512, 8 heads / 2 KV heads of 256 sliding, 512
full, no keys-as-values, the last 18 layers sharing KV, per-layer inputs of 256, causal attention over images,
softcap 30, tied) as tiny:gemma4 shrinks it, with E4B's knobs: no keys as values, no global KV head count, no
double-wide MLP, no bidirectional attention."""

VISION: dict[str, Any] = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "global_head_dim": 8,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "patch_size": 4,
    "pooling_kernel_size": 3,
    "position_embedding_size": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
    "use_clipped_linears": True,
    "standardize": False,
    "dtype": "bfloat16",
}
"""E4B's vision tower (16 blocks, hidden 768, 12 heads of 64, patch 16, 3x3 pooling, a 10240-entry position table,
RoPE theta 100, clipped linears, no standardisation) shrunk: 2 blocks, hidden 16, 2 heads of 8, 4-pixel patches, the
3x3 pooling kept (a 24x24 image is 6x6 patches, 2x2 soft tokens), a 16-entry position table."""

AUDIO: dict[str, Any] = {
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "subsampling_conv_channels": [8, 4],
    "conv_kernel_size": 3,
    "attention_chunk_size": 4,
    "attention_context_left": 5,
    "attention_context_right": 0,
    "output_proj_dims": 16,
    "use_clipped_linears": True,
    "dtype": "bfloat16",
}
"""E4B's audio tower (12 conformer layers, hidden 1024, 8 heads, subsampling channels [128, 32], kernel 5, chunks of
12 with 13 left context, 1536-wide output, clipped linears) shrunk: 1 layer, hidden 16, 2 heads, channels [8, 4],
kernel 3, chunks of 4 with 5 left context, 16-wide output."""

TOKENS: dict[str, Any] = {
    "boi_token_id": BOI,
    "boa_token_id": BOA,
    "image_token_id": IMAGE_TOKEN,
    "audio_token_id": AUDIO_TOKEN,
    "eoi_token_id": EOI,
    "eoa_token_id": EOA,
    "eoa_token_index": EOA,
    "video_token_id": VIDEO_TOKEN,
    "vision_soft_tokens_per_image": 4,
}
"""The multimodal ids (published E4B also writes eoa_token_id beside Gemma4Config's eoa_token_index) and the soft
tokens per image (published 280; 4 here, the tiny image's)."""

CLIP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")
"""The clipped linears' bound buffers (Gemma4ClippableLinear): drawn as bounds that clip (convcheck.fixtures.values
clip_bound_values), `*_min` in (-2, -0.5], `*_max` in [0.5, 2)."""

TINY_GEMMA4_VL = FixtureSpec(
    name="gemma4-vl",
    config_class="Gemma4Config",
    description="Gemma 4 VL dense (published E4B structure): tiny:gemma4's language model with E4B's knobs (KV "
    "sharing, per-layer inputs, dual RoPE, (2 sliding, 1 full) x2, tied), a 2-block vision tower with clipped linears "
    "and 3x3 pooling, its embedder, a 1-layer audio tower and its embedder",
    config={
        "text_config": TEXT,
        "vision_config": VISION,
        "audio_config": AUDIO,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 106,
        "pad_token_id": 0,
        **TOKENS,
    },
    clip_bounds=CLIP_BOUNDS,
)
"""Published E4B checkpoints end their chat turns with `<turn|>` (eos 106 at the top level, 1 in text_config); the
vocabulary stays tiny:gemma4's 128 (a multiple of 128, as published 262144: gemma4-dense-vocab-padded)."""

TINY_GEMMA4_VL_MOE = FixtureSpec(
    name="gemma4-vl-moe",
    config_class="Gemma4Config",
    description="Gemma 4 VL MoE (published 26B-A4B structure): tiny:gemma4-moe's language model with bidirectional "
    "attention over each image, the vision tower with clipped linears, 3x3 pooling and standardised soft tokens, its "
    "embedder, no audio tower",
    config={
        "text_config": {**TINY_GEMMA4_MOE.config, "use_bidirectional_attention": "vision", "dtype": "bfloat16"},
        "vision_config": {**VISION, "standardize": True},
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 106,
        "pad_token_id": 0,
        **TOKENS,
    },
    near_one_tensors=TINY_GEMMA4_MOE.near_one_tensors,
    clip_bounds=CLIP_BOUNDS,
)
"""26B-A4B (30 layers, hidden 2816, 128 experts top-8, keys as values on the full layers, no per-layer inputs, no KV
sharing; its vision tower of 27 blocks, hidden 1152, 16 heads of 72, standardised; `use_bidirectional_attention:
"vision"`: each image's tokens attend to each other both ways, Gemma 3's mask) shrunk as tiny:gemma4-moe and
tiny:gemma4-vl's tower."""

SHARED_KV_NULL_GLOBAL_HEADS = UpstreamBug(
    name="gemma4-shared-kv-null-global-kv-heads",
    summary="the Gemma 4 bridges' import synthesises zero k / v rows for a KV-shared layer (the checkpoint stores "
    "only its q_proj) and, for a full-attention one, sizes them by text_config.num_global_key_value_heads, which "
    "published E2B / E4B configs set null (transformers reads null as num_key_value_heads): None * head_dim raises "
    "TypeError, the import stops at the first KV-shared full-attention layer and nothing after it is loaded",
    where="megatron/bridge/models/gemma/gemma4_bridge.py:410-419 (maybe_modify_loaded_hf_weight: getattr finds the "
    "attribute, None, so the fallback to _dense_num_global_query_groups never applies); inherited by "
    "gemma_vl/gemma4_vl_bridge.py:67 (Gemma4VLBridge); transformers models/gemma4/configuration_gemma4.py:182",
    findings=(("coverage", "<import>", "import-failed"),),
    consequences=(
        ("coverage", "*", "not-loaded"),
        ("logits", "*", "logits-differ"),
        ("logits", "*", "greedy-differs"),
    ),
    seen_in=("0.6.2",),
    message_contains="NoneType",
)
"""Seen on tiny:gemma4-vl (E4B's null num_global_key_value_heads; layer 5 is KV-shared and full-attention, as E4B's
layers 29, 35 and 41 are): coverage names the import's TypeError and layer 5's parameters never written, every
other finding follows from the NaN they keep. With the null read as num_key_value_heads
(tests/support/hooks_gemma4_vl.py:shared_kv_global_heads_fixed) the import completes."""

SHARED_KV_NULL_GLOBAL_HEADS_UNLOADED = replace(
    SHARED_KV_NULL_GLOBAL_HEADS,
    findings=(
        ("mapping", "language_model.decoder.layers.*", "import-bytes-differ"),
        ("roundtrip", "model.language_model.layers.*", "bytes-differ"),
        ("layout", "model.language_model.layers.*", "tp1-differs-from-source"),
        ("save", "model.language_model.layers.*", "bytes-differ"),
        ("broadcast", "model.language_model.layers.*", "bytes-differ"),
    ),
    consequences=(),
    message_contains="got nan",
)
"""The same bug as the oracles that compare values see it: the parameters the crashed import never wrote hold the
NaN convcheck fills them with before the import (`got nan`), named where no coverage run shows the crash itself (a
selftest launch runs only the oracles its mutants need). A value a planted bug moves is finite: it is never tagged."""

SHARED_KV_NULL_GLOBAL_HEADS_UNSENT = replace(
    SHARED_KV_NULL_GLOBAL_HEADS,
    findings=(
        ("receiver", "model.language_model.layers.*", "not-written"),
        ("idempotence", "model.language_model.layers.*", "not-written"),
    ),
    consequences=(),
    message_contains="NaN sentinel",
)
"""The same bug as the sync receivers see it: the NaN parameters stream out, and a receiver's buffer keeps its NaN
sentinel where they land (`still the NaN sentinel`)."""

VL_SHARED_KV_K_NORM_UNMAPPED = replace(
    SHARED_KV_K_NORM_UNMAPPED,
    where="megatron/bridge/models/gemma/gemma4_bridge.py:453 (_dense_mapping_registry, called with megatron_prefix "
    "'language_model.' by gemma_vl/gemma4_vl_bridge.py:222); gemma/modeling_gemma4.py:304 and :758",
    findings=tuple(
        (oracle, "language_model." + tensor, kind) for oracle, tensor, kind in SHARED_KV_K_NORM_UNMAPPED.findings
    ),
)
"""gemma4-shared-kv-k-norm-unmapped on the VL model's language_model (tiny:gemma4-vl's layers 4 and 5)."""

IMAGE_ATTENTION_CAUSAL = UpstreamBug(
    name="gemma4-vl-image-attention-causal",
    summary="where text_config.use_bidirectional_attention is 'vision' (26B-A4B, 31B), Gemma4VLModel builds a mask "
    "letting each image's tokens attend to each other both ways and hands it to the language model, whose attention "
    "keeps the causal mask type of its layer spec: Transformer Engine's DotProductAttention ignores a passed mask "
    "under AttnMaskType.causal, so image tokens attend causally where transformers' Gemma4Model attends within each "
    "image both ways: every image token but the last and every later token differ (text-only input is unaffected)",
    where="megatron/bridge/models/gemma_vl/modeling_gemma4_vl.py:311, :366-391 (the mask, computed and passed); "
    "gemma/modeling_gemma4.py:1517-1535 (_gemma4_block_spec keeps get_gpt_decoder_block_spec's AttnMaskType.causal, "
    "megatron-core models/gpt/gpt_layer_specs.py:120) and :752 (the dense spec's causal); transformers "
    "models/gemma4/modeling_gemma4.py:2350-2356 (block_sequence_ids)",
    findings=(
        ("logits", "logits[[]image[]]", "logits-differ"),
        ("logits", "greedy-tokens[[]image[]]", "greedy-differs"),
    ),
    config_holds=(("text_config.use_bidirectional_attention", "vision"),),
    seen_in=("0.6.2",),
)
"""Seen on tiny:gemma4-vl-moe at TP1: the image logits differ by 3.9e-2 (9 of 16 greedy tokens change); with
transformers' Gemma4Model run causal over the image (tests/support/hooks_gemma4_vl.py:hf_image_attention_causal) they
agree to 1.4e-7. On the CPU the attention is convcheck's Transformer Engine stand-in, which follows TE's rule (a
mask is read only for padding / arbitrary mask types, convcheck/kernels/te/attention.py:133)."""

CONFIG_EXPORT_DROPS_BIDIRECTIONAL = UpstreamBug(
    name="gemma4-vl-config-export-drops-bidirectional",
    summary="Gemma4VLBridge.megatron_to_hf_config exports text_config from the Gemma 4 text export, which writes no "
    "use_bidirectional_attention, though the provider keeps the source text_config: an exported 26B-A4B / 31B "
    "config.json loses 'vision' and transformers then runs causal attention over images",
    where="megatron/bridge/models/gemma_vl/gemma4_vl_bridge.py:152, :180 (text_config from Gemma4Bridge's export); "
    "gemma/gemma4_bridge.py:304-341 (no use_bidirectional_attention)",
    findings=(("config", "text_config.use_bidirectional_attention (megatron_to_hf_config)", "roundtrip-mismatch"),),
    config_holds=(("text_config.use_bidirectional_attention", "vision"),),
    seen_in=("0.6.2",),
)
"""Seen on tiny:gemma4-vl-moe: the config oracle's export roundtrip names text_config.use_bidirectional_attention,
'vision' in the source, None exported."""

VL_MOE_POST_LAYERNORM_DEFAULT_EPS = replace(
    MOE_POST_LAYERNORM_DEFAULT_EPS, config_holds=(("text_config.enable_moe_block", True),)
)
"""te-post-layernorm-default-eps on the MoE VL model's language model (its variant read in text_config)."""

DENSE_PER_LAYER_REFUSED = UpstreamBug(
    name="gemma4-vl-dense-per-layer-refused",
    summary="the 0.5.x Gemma 4 VL bridge refuses every dense model with per-layer inputs (hidden_size_per_layer_input "
    "set and enable_moe_block false): the published E2B / E4B checkpoints raise ValueError before any model is built",
    where="megatron/bridge/models/gemma_vl/gemma4_vl_bridge.py:78-84 (0.5.1)",
    findings=BUILD_FAILED,
    message_contains="only supports MoE models",
    seen_in=("0.5.0", "0.5.1"),
    fixed_in="0.6.0",
)
"""Seen by `convcheck support` on bridge 0.5.1 (Gemma4ForConditionalGeneration from transformers 5.8.1's default
config, dense with per-layer inputs)."""


def _under_vl(pattern: str) -> str:
    """A text model's tensor pattern as the VL model names it: `model.layers.*` -> `model.language_model.layers.*`,
    `decoder.*` -> `language_model.decoder.*` (others unchanged)."""
    if pattern.startswith("model.layers."):
        return "model.language_model." + pattern.removeprefix("model.")
    return "language_model." + pattern if pattern.startswith("decoder.") else pattern


def vl_variant(bug: UpstreamBug, **changes: Any) -> UpstreamBug:
    """A 0.5.x Gemma 4 MoE text bug as the VL MoE model shows it: its patterns under the language model, its variant
    read in text_config; the same name (the same provider code)."""
    fields: dict[str, Any] = {
        "findings": tuple((o, _under_vl(t), k) for o, t, k in bug.findings),
        "consequences": tuple((o, _under_vl(t), k) for o, t, k in bug.consequences),
        "config_holds": (("text_config.enable_moe_block", True),),
    }
    return replace(bug, **{**fields, **changes})


VL_MOE_05_BUGS = (
    vl_variant(MOE_LAYER_UNPATCHED),
    vl_variant(MOE_FUSED_WEIGHTS),
    vl_variant(CONFIG_EXPORT_GENERIC, config_holds=()),
)
"""Seen by the release smoke on tiny:gemma4-vl-moe at 0.5.0 and 0.5.1: the text MoE's 0.5.x bugs (the provider's
block spec, the fused router and dense-MLP weights, the generic config export) under the VL model's names."""

GEMMA4_VL = Architecture(
    hf_classes=("Gemma4ForConditionalGeneration",),
    model_type="gemma4",
    mapping_rules="convcheck.models.gemma4_vl_mappings:gemma4_vl_rules",
    config_rules=GEMMA4_VL_TABLE,
    fixtures=(TINY_GEMMA4_VL, TINY_GEMMA4_VL_MOE),
    upstream_bugs=(
        SHARED_KV_NULL_GLOBAL_HEADS,
        SHARED_KV_NULL_GLOBAL_HEADS_UNLOADED,
        SHARED_KV_NULL_GLOBAL_HEADS_UNSENT,
        VL_SHARED_KV_K_NORM_UNMAPPED,
        DENSE_PP_REFUSED,
        IMAGE_ATTENTION_CAUSAL,
        CONFIG_EXPORT_DROPS_BIDIRECTIONAL,
        VL_MOE_POST_LAYERNORM_DEFAULT_EPS,
        DENSE_PER_LAYER_REFUSED,
        *VL_MOE_05_BUGS,
    ),
)
