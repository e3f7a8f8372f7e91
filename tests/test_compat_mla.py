"""Multi-latent-attention shims 15-18 (DeepSeek V2/V3, Moonlight): each still-needed test fails once upstream no longer
needs its shim. The spec itself (the bridge's block spec, TE-free) is exercised by tests/test_deepseek.py."""

from __future__ import annotations

import inspect

from convcheck import compat
from convcheck.compat.detect import optional_module
from convcheck.compat.no_te import local_attention_takes_mla_channels, mla_core_attention
from tests.support.release_targets import skip_unless


def _module(name: str):  # type: ignore[no-untyped-def]
    compat.install_import_shims()
    module = optional_module(name)
    skip_unless(module is not None, name)
    return module


def test_shim15_still_needed_local_attention_lacks_mla_channels() -> None:
    """Fails when the local DotProductAttention takes MLA's k_channels / v_channels (then delete shim 15)."""
    mla = _module("megatron.core.transformer.multi_latent_attention")
    source = inspect.getsource(mla.MultiLatentAttention.__init__)
    assert "k_channels=self.q_head_dim" in source and "v_channels=self.config.v_head_dim" in source
    assert not local_attention_takes_mla_channels()


def test_shim16_still_needed_bridge_mtp_spec_asks_for_te() -> None:
    """Fails when the bridge's MTP block spec stops hard-coding Transformer Engine (then delete shim 16)."""
    provider = _module("megatron.bridge.models.gpt_provider")
    source = inspect.getsource(compat.upstream(provider.mtp_block_spec))
    assert "get_gpt_mtp_block_spec(config, spec, use_transformer_engine=True" in source
    # provide() looks the function up by name (0.6: `mtp_block_spec=mtp_block_spec(self`, 0.4: `kwargs[...] = ...`)
    assert "= mtp_block_spec(self" in inspect.getsource(provider.GPTModelProvider.provide).replace("=mtp", "= mtp")


def test_shim17_still_needed_q_proj_without_lora_needs_a_fused_norm() -> None:
    """Fails when the MLA qk-norm resolver accepts a plain q projection without TE (then delete shim 17)."""
    resolver = _module("megatron.core.transformer.mla_qk_norm_config").QKNormConfigResolver
    source = inspect.getsource(compat.upstream(resolver._mla_fused_linear_or_default))
    assert "return self._require_linear(self.fused_norm_linear_impl, module_name)" in source
    from megatron.core.models.backends import LocalSpecProvider

    assert LocalSpecProvider().column_parallel_layer_norm_linear() is None


def test_shim18_still_needed_yarn_rope_allocates_on_cuda() -> None:
    """Fails when Yarn RoPE stops asking torch.cuda.current_device() (then delete shim 18)."""
    yarn = _module("megatron.core.models.common.embeddings.yarn_rotary_pos_embedding")
    init = inspect.getsource(compat.upstream(yarn.YarnRotaryEmbedding.__init__))
    get_emb = inspect.getsource(compat.upstream(yarn.YarnRotaryEmbedding.get_emb))
    assert "torch.cuda.current_device()" in init and get_emb.count("torch.cuda.current_device()") == 2


def test_mla_core_attention_is_the_local_one_taking_mla_channels() -> None:
    _module("megatron.core.transformer.dot_product_attention")
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    assert issubclass(mla_core_attention(), DotProductAttention)
    params = inspect.signature(mla_core_attention().__init__).parameters
    assert {"k_channels", "v_channels"} <= set(params)
