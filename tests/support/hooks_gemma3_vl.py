"""`--hook`s of tests/test_gemma3_vl.py: the fix of the Gemma 3 VL projector geometry bug
(gemma3-vl-projector-geometry-fixed), alone and with te-post-layernorm-default-eps's fix."""

from __future__ import annotations

from typing import Any


def projector_geometry_from_config() -> None:
    """gemma3-vl-projector-geometry-fixed fixed: the provider's projector config takes image_size, patch_dim and
    tokens_per_image from vision_config.image_size, patch_size and mm_tokens_per_image (what HF's
    Gemma3MultiModalProjector reads), beside the widths the bridge already sets."""
    from megatron.bridge.models.gemma_vl.gemma3_vl_bridge import Gemma3VLBridge

    provider_bridge = Gemma3VLBridge.provider_bridge

    def fixed(self: Any, hf_pretrained: Any) -> Any:
        provider = provider_bridge(self, hf_pretrained)
        hf_config = hf_pretrained.config
        projector = provider.vision_projector_config
        projector.image_size = hf_config.vision_config.image_size
        projector.patch_dim = hf_config.vision_config.patch_size
        projector.tokens_per_image = hf_config.mm_tokens_per_image
        return provider

    Gemma3VLBridge.provider_bridge = fixed


def both_fixed() -> None:
    """projector_geometry_from_config and te-post-layernorm-default-eps's fix (hooks_te_families.post_norm_eps_fixed):
    with both, what is left between the two forwards is what the bridge computes otherwise than HF."""
    from tests.support.hooks_te_families import post_norm_eps_fixed

    projector_geometry_from_config()
    post_norm_eps_fixed()


def both_fixed_image_mask_causal() -> None:
    """both_fixed, and a planted bug: the bridge's attention bias built as if no token were an image token (causal
    and sliding only), so the soft tokens no longer attend to the later soft tokens of their image as HF's
    token_type_ids mask lets them."""
    from megatron.bridge.models.gemma_vl.modeling_gemma3_vl import Gemma3VLModel

    both_fixed()
    compute = Gemma3VLModel._compute_attention_biases

    def causal(self: Any, input_ids: Any, *, dtype: Any) -> Any:
        if input_ids is None:
            return compute(self, input_ids, dtype=dtype)
        return compute(self, input_ids.masked_fill(input_ids == self.config.image_token_id, 0), dtype=dtype)

    Gemma3VLModel._compute_attention_biases = causal
