"""Gemma 3 VL (Gemma3ForConditionalGeneration, model_type gemma3): the Gemma 3 text model (convcheck.models.gemma3)
under a SigLIP vision tower and Gemma 3's multi-modal projector (average pooling of the patch grid to
mm_tokens_per_image soft tokens, the soft-embedding RMSNorm, a [V, H] projection); config table, tiny fixture and
the bridge bugs convcheck names.

megatron-bridge 0.6.2 builds it as a Gemma3VLModel (gemma_vl/gemma3_vl_bridge.py, gemma3_vl_provider.py,
modeling_gemma3_vl.py): the language model from the Gemma 3 TE layer spec, the vision tower as transformers' own
SigLIP module (replicated on every rank), the projector from a TENorm and a ColumnParallelLinear. Published checkpoints
(google/gemma-3-4b-it, 12b-it, 27b-it) name the tower `vision_tower.vision_model.*`, the decoder
`language_model.model.*` and the projector `multi_modal_projector.*`.
"""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.fixture_spec import FixtureSpec
from convcheck.models.gemma3 import EXPORT_DROPS_GLOBAL_ROPE_SCALING, LAYER_PATTERN_HARD_CODED, TINY_GEMMA3
from convcheck.models.gemma3_vl_config import GEMMA3_VL_TABLE
from convcheck.models.registered_bugs import GEMMA3_VL_POOLING_HEAD_DROPPED
from convcheck.models.te_spec_bugs import POST_LAYERNORM_DEFAULT_EPS
from convcheck.models.upstream_bug import UpstreamBug

BOI, EOI, IMAGE = 148, 149, 150
"""`<start_of_image>`, `<end_of_image>` and `<image_soft_token>` in the tiny vocabulary (published: 255999, 256000,
262144 of a 262208 vocabulary: the image token inside it, as here)."""

SPECIAL_TOKENS = {"boi_token:<start_of_image>": BOI, "eoi_token:<end_of_image>": EOI,
                  "image_token:<image_soft_token>": IMAGE}  # fmt: skip
"""The image tokens as the published tokenizer names them (its tokenizer_config's boi_token, eoi_token and image_token,
which Gemma3Processor reads)."""

VISION: dict[str, Any] = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "image_size": 16,
    "patch_size": 4,
    "num_channels": 3,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "vision_use_head": False,
}
"""The published SigLIP tower (gemma-3-4b-it: 27 layers, hidden 1152, 16 heads, MLP 4304, 896-pixel images in
14-pixel patches: a 64x64 grid, vision_use_head false) shrunk: 2 layers, hidden 16 in 2 heads, a 16-pixel image in
4-pixel patches (a 4x4 grid of 16 position embeddings); no pooling head, as published."""

MM_TOKENS = 4
"""Soft tokens per image (published 256: the 64x64 grid average-pooled 4x4 to 16x16); here the 4x4 grid pooled 2x2 to
2x2, so the pooling averages four patches per token as the published one averages sixteen."""

TEXT: dict[str, Any] = {**TINY_GEMMA3.config, "dtype": "bfloat16"}
"""tiny:gemma3's language model (6 layers 5:1 sliding / full, window 8, local / global RoPE bases with linear 8 on the
global one, sandwich norms, query_pre_attn_scalar 16), the dtype repeated in text_config as transformers writes it."""


def published_vision_names(layers: int, head: bool = False) -> dict[str, str]:
    """The SigLIP tower's tensor names as transformers 5.12.1 saves them (`vision_tower.X`) -> as the published
    checkpoints name them (`vision_tower.vision_model.X`), for a tower of `layers` encoder layers (and its pooling
    head's, with `head`)."""
    own = ["embeddings.patch_embedding.weight", "embeddings.patch_embedding.bias",
           "embeddings.position_embedding.weight", "post_layernorm.weight", "post_layernorm.bias"]  # fmt: skip
    modules = ("layer_norm1", "layer_norm2", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
               "self_attn.out_proj", "mlp.fc1", "mlp.fc2")  # fmt: skip
    per_layer = [f"{module}.{kind}" for module in modules for kind in ("weight", "bias")]
    names = own + [f"encoder.layers.{i}.{name}" for i in range(layers) for name in per_layer]
    if head:
        names += ["head.probe", "head.attention.in_proj_weight", "head.attention.in_proj_bias",
                  *(f"head.{m}.{k}" for m in ("attention.out_proj", "layernorm", "mlp.fc1", "mlp.fc2")
                    for k in ("weight", "bias"))]  # fmt: skip
    return {f"vision_tower.{name}": f"vision_tower.vision_model.{name}" for name in names}


TINY_GEMMA3_VL = FixtureSpec(
    name="gemma3-vl",
    config_class="Gemma3Config",
    description="Gemma 3 VL (published 4B-27B structure): tiny:gemma3's language model (5:1 sliding / global, dual "
    "RoPE, sandwich norms, tied) under a 2-layer SigLIP tower without pooling head, the projector's 2x2 average "
    "pooling to 4 soft tokens, soft-embedding norm and projection; an image processor for 16-pixel images",
    config={
        "text_config": TEXT,
        "vision_config": VISION,
        "mm_tokens_per_image": MM_TOKENS,
        "boi_token_index": BOI,
        "eoi_token_index": EOI,
        "image_token_index": IMAGE,
        "tie_word_embeddings": True,
    },
    renames=published_vision_names(VISION["num_hidden_layers"]),
    special_tokens=SPECIAL_TOKENS,
)
"""transformers 5.12.1 saves the tower as `vision_tower.*`; the published checkpoints' `vision_tower.vision_model.*`
names are restored (transformers and the bridge read both: gemma3_vl_bridge.py:114-123)."""

PROJECTOR_GEOMETRY_FIXED = UpstreamBug(
    name="gemma3-vl-projector-geometry-fixed",
    summary="the Gemma 3 VL bridge sets only the projector's input and output widths: its image_size, patch_dim and "
    "tokens_per_image keep the 4B-27B checkpoints' 896, 14 and 256, never read from vision_config.image_size, "
    "patch_size and mm_tokens_per_image, so a tower of another patch grid (or another soft-token count) is reshaped "
    "as a 64x64 grid and pooled 4x4: the image forward raises (or pools the wrong patches) and HF's "
    "Gemma3MultiModalProjector is not what Megatron computes",
    where="megatron/bridge/models/gemma_vl/gemma3_vl_bridge.py:97-99 (input_size and hidden_size only); "
    "modeling_gemma3_vl.py:283-285 (the 896 / 14 / 256 defaults), :309-312 (patches per side and the pooling kernel "
    "from them), :335 (the reshape)",
    findings=(
        ("config", "*image_size+vision_config.patch_size -> model.multi_modal_projector.patches_per_side", "mismatch"),
        ("config", "mm_tokens_per_image -> model.multi_modal_projector.avg_pool.kernel_size", "mismatch"),
        ("logits", "<megatron forward>[[]image[]]", "forward-failed"),
    ),
    consequences=(
        ("logits", "logits[[]image[]]", "logits-differ"),
        ("logits", "greedy-tokens[[]image[]]", "greedy-differs"),
    ),
    seen_in=("0.3.0", "0.3.1", "0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen on tiny:gemma3-vl (16-pixel images in 4-pixel patches, 4 soft tokens): the projector reshapes as 64x64 and the
image pass raises (at PP2 the last stage then computes on the first stage's NaN: its image logits and greedy tokens
differ as a consequence); with the projector's geometry read from the HF config (tests/support/hooks_gemma3_vl.py:
projector_geometry_from_config) the image logits agree with HF's (tests/test_gemma3_vl.py)."""

CONFIG_EXPORT_FLAT = UpstreamBug(
    name="gemma3-vl-config-export-flat",
    summary="the Gemma 3 VL bridge inherits the generic megatron_to_hf_config, which writes the language model's "
    "fields at the top level of the exported dict: Gemma3Config reads them from text_config and vision_config only, "
    "so the exported config describes transformers' default Gemma 3 (26 layers, hidden 2304, a 224-pixel SigLIP "
    "tower in 16-pixel patches, 256 soft tokens, image token 262144, no global RoPE scaling), not the model converted",
    where="megatron/bridge/models/conversion/model_bridge.py:695-760 (megatron_to_hf_config, flat CONFIG_MAPPING); "
    "gemma_vl/gemma3_vl_bridge.py:37-176 (no override, no vision fields)",
    findings=(("config", "* (megatron_to_hf_config)", "roundtrip-mismatch"),),
    seen_in=("0.3.1", "0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""qwen3-vl-config-export-flat's twin. Seen on tiny:gemma3-vl: every text_config / vision_config field, the soft-token
count and the image token come back as Gemma3Config's defaults. Import, export of the weights and the forward are
unaffected."""

PUBLISHED_TOWER_NAMES_UNREAD = UpstreamBug(
    name="gemma3-vl-published-tower-names-unread",
    summary="the 0.5.x Gemma 3 VL bridge maps the SigLIP tower only under transformers 5's flattened names "
    "(vision_tower.*), while published checkpoints hold vision_tower.vision_model.*: no tower tensor is loaded (the "
    "tower trains from its initial values) and the export writes the tower under names the checkpoint does not have",
    where="megatron/bridge/models/gemma_vl/gemma3_vl_bridge.py (0.5.1: hf_param='vision_tower.**' only)",
    findings=(
        ("coverage", "vision_tower.*", "hf-missing"),
        ("coverage", "vision_tower.*", "not-loaded"),
        ("*", "vision_tower.vision_model.*", "not-exported"),
        ("*", "vision_tower.vision_model.*", "never-written"),
        ("*", "vision_tower.vision_model.*", "missing"),
        ("mapping", "vision_tower.*", "import-bytes-differ"),
    ),
    seen_in=("0.5.0", "0.5.1"),
    fixed_in="0.6.0 (the published namespace kept where the checkpoint holds it)",
)
"""Seen by the release smoke on tiny:gemma3-vl (the published tower names) on 0.5.0 and 0.5.1."""

GEMMA3_VL = Architecture(
    hf_classes=("Gemma3ForConditionalGeneration",),
    model_type="gemma3",
    mapping_rules="convcheck.models.gemma3_vl_mappings:gemma3_vl_rules",
    config_rules=GEMMA3_VL_TABLE,
    fixtures=(TINY_GEMMA3_VL,),
    upstream_bugs=(
        POST_LAYERNORM_DEFAULT_EPS,
        PROJECTOR_GEOMETRY_FIXED,
        CONFIG_EXPORT_FLAT,
        GEMMA3_VL_POOLING_HEAD_DROPPED,
        EXPORT_DROPS_GLOBAL_ROPE_SCALING,
        LAYER_PATTERN_HARD_CODED,
        PUBLISHED_TOWER_NAMES_UNREAD,
    ),
)
