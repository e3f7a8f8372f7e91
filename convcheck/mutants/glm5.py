"""Planted GLM-5 bugs, each patching the real Megatron-Bridge classes at run time: the DSA indexer's k_norm weight
never exported, and the indexer's RoPE built interleaved where transformers rotates half-split pairs."""

from __future__ import annotations

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.param_mapping import AutoMapping
from megatron.bridge.models.glm_moe_dsa.glm5_bridge import GLM5Bridge
from megatron.bridge.models.model_provider import ModelProviderMixin

from convcheck.mutants.patch import alter_provider, wrap

K_NORM_WEIGHT = "self_attention.core_attention.indexer.k_norm.weight"


def indexer_k_norm_not_exported() -> None:
    """The export of every layer's indexer k_norm weight (HF self_attn.indexer.k_norm.weight) yields nothing, as a
    registry that lost that mapping's export direction would: the exported checkpoint lacks the key norm's scale."""

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            return {} if str(self.megatron_param).endswith(K_NORM_WEIGHT) else out

        return megatron_to_hf

    wrap(AutoMapping, "megatron_to_hf", make)


def indexer_rope_interleaved() -> None:
    """The provider builds the indexer's RoPE on interleaved pairs (dsa_indexer_rope_interleaved True), where
    transformers' indexer rotates half-split pairs (modeling_glm_moe_dsa.py:238): the top-k key choice changes."""

    def change(provider: ModelProviderMixin) -> None:
        provider.dsa_indexer_rope_interleaved = True

    alter_provider(change, GLM5Bridge)
