"""Planted Gemma 4 bugs, each patching the real Megatron-Bridge classes at run time. Dense: one sliding layer attending
as a global one, the sliding layers rotated with the global RoPE base, the post-attention norm traded with the
pre-feedforward norm, and (outside the catalog) the final logit softcap dropped. MoE: the dense MLP's and the experts'
input norms traded, one layer's router per-expert scale left at its initial ones."""

from __future__ import annotations

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.param_mapping import ReplicatedMapping
from megatron.bridge.models.gemma import modeling_gemma4
from megatron.bridge.models.gemma.gemma4_bridge import Gemma4Bridge
from megatron.bridge.models.model_provider import ModelProviderMixin

from convcheck.mutants.olmoe import _rename_resolved
from convcheck.mutants.patch import alter_provider, wrap

POST_ATTENTION, PRE_FEEDFORWARD = "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight"
PRE_EXPERTS = "pre_feedforward_layernorm_2.weight"
"""Gemma 4 MoE: the experts' input norm (HF pre_feedforward_layernorm_2); pre_feedforward_layernorm is the dense
MLP's."""
PER_EXPERT_SCALE = "decoder.layers.3.mlp.router.per_expert_scale"
SLIDING_LAYER = 1
"""The layer number (from 1) `sliding_layer_global` builds without its window: tiny:gemma4's first sliding layer."""


def sliding_layer_global() -> None:
    """Layer 1's core attention (a sliding layer) built without its window, as a full layer's is; its head widths and
    local RoPE stay: one layer attends to every earlier position where HF's sees the last sliding_window."""

    def make(original):  # type: ignore[no-untyped-def]
        def __init__(self, config, submodules, layer_number, *args, **kwargs):  # type: ignore[no-untyped-def]
            original(self, config, submodules, layer_number, *args, **kwargs)
            if layer_number == SLIDING_LAYER:
                self.core_attention.scale_mask_softmax.window_size = None

        return __init__

    wrap(modeling_gemma4.Gemma4DenseSelfAttention, "__init__", make)


def sliding_rope_base_global() -> None:
    """The provider's sliding-layer RoPE base built as the full layers' one: the sliding layers rotate with the
    global theta."""

    def change(provider: ModelProviderMixin) -> None:
        provider.sliding_window_rope_base = provider.full_attention_rope_base

    alter_provider(change, Gemma4Bridge)


def post_attention_norm_pre_feedforward() -> None:
    """Every layer's post-attention norm (post_self_attn_layernorm) maps to HF pre_feedforward_layernorm and its
    pre-feedforward norm (pre_mlp_layernorm) to post_attention_layernorm, in import and export alike."""

    def change(_megatron: str, hf: str) -> str:
        if hf.endswith(POST_ATTENTION):
            return hf.replace(POST_ATTENTION, PRE_FEEDFORWARD)
        return hf.replace(PRE_FEEDFORWARD, POST_ATTENTION) if hf.endswith(PRE_FEEDFORWARD) else hf

    _rename_resolved(change)


def softcap_dropped() -> None:
    """The provider built without the final logit softcap: the output layer returns the raw logits (a forward-only bug
    the logits oracle sees on tiny:gemma4, whose cap of 0.5 bends its largest logits; run by hand, recorded in
    docs/families.md)."""

    def change(provider: ModelProviderMixin) -> None:
        provider.final_logit_softcapping = None

    alter_provider(change, Gemma4Bridge)


def moe_input_norms_traded() -> None:
    """Gemma 4 MoE: every layer's experts' input norm (pre_mlp_layernorm) maps to HF pre_feedforward_layernorm, the
    dense MLP's, and the dense MLP's (pre_shared_expert_layernorm) to pre_feedforward_layernorm_2, the experts', in
    import and export alike (the two names a bridge can trade: the dense variant's pre_mlp_layernorm is the former)."""

    def change(_megatron: str, hf: str) -> str:
        if hf.endswith(PRE_EXPERTS):
            return hf.replace(PRE_EXPERTS, PRE_FEEDFORWARD)
        return hf.replace(PRE_FEEDFORWARD, PRE_EXPERTS) if hf.endswith(PRE_FEEDFORWARD) else hf

    _rename_resolved(change)


def per_expert_scale_left_at_init() -> None:
    """Gemma 4 MoE: the import of layer 3's router per_expert_scale writes nothing: it keeps its initial ones (the
    routing weights of that layer lose their per-expert scale; the export writes the ones back)."""

    def make(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, hf_weights, megatron_module)
            if self.megatron_param != PER_EXPERT_SCALE:
                return out
            return megatron_module.per_expert_scale.detach().clone()

        return hf_to_megatron

    wrap(ReplicatedMapping, "hf_to_megatron", make)
