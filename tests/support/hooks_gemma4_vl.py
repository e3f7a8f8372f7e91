"""Rank-side hooks for hand runs on Gemma 4 VL (`convcheck verify --hook tests.support.hooks_gemma4_vl:NAME`): the
known bridge bugs fixed one at a time, to measure what each explains."""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.gemma import gemma4_bridge


def shared_kv_global_heads_fixed() -> None:
    """gemma4-shared-kv-null-global-kv-heads fixed: a null num_global_key_value_heads read as num_key_value_heads
    (what transformers' Gemma4TextAttention and the bridge's own provider do) when the import synthesises a KV-shared
    full-attention layer's zero k / v rows."""
    cls = gemma4_bridge.Gemma4Bridge
    original = cls.maybe_modify_loaded_hf_weight

    def fixed(self: Any, hf_param: Any, hf_state_dict: Any) -> Any:
        text = self._text_config()
        if text is not None and getattr(text, "num_global_key_value_heads", 0) is None:
            text.num_global_key_value_heads = text.num_key_value_heads
        return original(self, hf_param, hf_state_dict)

    cls.maybe_modify_loaded_hf_weight = fixed


def vl_mask_dropped() -> None:
    """shared_kv_global_heads_fixed, and Gemma4VLModel's own attention mask replaced by None (what the text model's
    forward gets: the attention builds its own causal / sliding mask)."""
    from megatron.bridge.models.gemma_vl import modeling_gemma4_vl

    shared_kv_global_heads_fixed()
    modeling_gemma4_vl.Gemma4VLModel._compute_attention_mask = lambda self, input_ids: None


def hf_image_attention_causal() -> None:
    """te-post-layernorm-default-eps fixed (tests.support.hooks_te_families:post_norm_eps_fixed), and transformers'
    Gemma4Model run with causal attention over images (use_bidirectional_attention read as None): what the Megatron
    model computes if it does not apply its bidirectional image mask."""
    from transformers.models.gemma4 import modeling_gemma4

    from tests.support.hooks_te_families import post_norm_eps_fixed

    post_norm_eps_fixed()
    original = modeling_gemma4.Gemma4Model.forward

    def causal(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.config.get_text_config().use_bidirectional_attention = None
        return original(self, *args, **kwargs)

    modeling_gemma4.Gemma4Model.forward = causal
