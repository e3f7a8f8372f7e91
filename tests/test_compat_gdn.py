"""Gated-DeltaNet shims 19-21 (Qwen3-Next, Qwen3.5): each still-needed test fails once upstream no longer needs its
shim; the torch kernels and norms they bring are checked against their formulas. The spec and the kernels are
exercised end to end (against HF's torch GDN path) by the logits oracle in tests/test_qwen_next.py."""

from __future__ import annotations

import inspect

import pytest
import torch

from convcheck import compat
from convcheck.compat.detect import optional_module
from convcheck.kernels.gdn import torch_causal_conv1d, torch_l2norm
from convcheck.kernels.norms import ZeroCenteredRMSNorm
from tests.support.release_targets import skip_unless


def _module(name: str):  # type: ignore[no-untyped-def]
    compat.install_import_shims()
    module = optional_module(name)
    skip_unless(module is not None, name)
    return module


def test_shim19_still_needed_gdn_needs_fla() -> None:
    """Fails when megatron-core builds a GatedDeltaNet without flash-linear-attention (then delete shim 19)."""
    common = _module("megatron.core.ssm.gated_delta_net.common")
    source = inspect.getsource(compat.upstream(common._GDNBase.__init__))
    assert "if not HAVE_FLA:" in source and "raise ImportError" in source
    assert optional_module("fla") is None  # the shim is installed only while fla is missing


def test_shim20_still_needed_experimental_spec_asserts_te() -> None:
    """Fails when the experimental-attention block spec accepts a non-TE backend (then delete shim 20)."""
    specs = _module("megatron.core.models.gpt.experimental_attention_variant_module_specs")
    assert 'config.transformer_impl == "transformer_engine"' in inspect.getsource(specs._get_backend_spec_provider)
    assert "get_gpt_layer_with_transformer_engine_spec" in inspect.getsource(specs._get_self_attention_module_spec)


def test_shim21_still_needed_torch_norm_rejects_zero_centered_gamma() -> None:
    """Fails when megatron-core's torch norm fallback accepts zero-centered gamma (then delete shim 21)."""
    torch_norm = _module("megatron.core.transformer.torch_norm")
    source = inspect.getsource(compat.upstream(torch_norm.WrappedTorchNorm.__new__))
    assert "not config.layernorm_zero_centered_gamma" in source


def test_causal_conv1d_is_a_left_padded_depthwise_conv_then_silu() -> None:
    """y[t] = silu(sum_j w[:, j] x[t - 3 + j] + b) with zeros before t = 0, per channel."""
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 5, 3, generator=gen), torch.randn(3, 4, generator=gen), torch.randn(3, generator=gen)
    y, state = torch_causal_conv1d(x, w, b, activation="silu")
    padded = torch.cat([torch.zeros(2, 3, 3), x], dim=1)
    expected = torch.stack([(padded[:, t : t + 4] * w.T).sum(1) + b for t in range(5)], dim=1)
    assert state is None and torch.allclose(y, torch.nn.functional.silu(expected), atol=1e-6)
    with pytest.raises(NotImplementedError, match="cu_seqlens"):
        torch_causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 5]))


def test_l2norm_divides_by_the_l2_norm_in_fp32() -> None:
    x = torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16)
    y = torch_l2norm(x)
    assert y.dtype == torch.bfloat16 and y.float().tolist() == [[0.6015625, 0.80078125]]


def test_zero_centered_rmsnorm_scales_by_one_plus_weight() -> None:
    norm = ZeroCenteredRMSNorm(2, eps=0.0)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([0.0, 1.0]))
    assert norm(torch.tensor([[3.0, 4.0]]))[0].tolist() == pytest.approx([3 / 12.5**0.5, 8 / 12.5**0.5])


def test_zero_centered_norm_goes_through_the_torch_fallback_under_the_rmsnorm_name() -> None:
    """Shim 21: a zero-centered RMSNorm config gets the torch zero-centered norm (class name RMSNorm, which the bridge
    maps as replicated); any other config the upstream norm."""
    torch_norm = _module("megatron.core.transformer.torch_norm")
    compat.install("cpu")
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(num_layers=1, hidden_size=8, num_attention_heads=2, normalization="RMSNorm")
    norm = torch_norm.WrappedTorchNorm(TransformerConfig(**base, layernorm_zero_centered_gamma=True), 8, 1e-6)
    assert isinstance(norm, ZeroCenteredRMSNorm) and type(norm).__name__ == "RMSNorm"
    assert norm.weight.abs().sum() == 0
    plain = torch_norm.WrappedTorchNorm(TransformerConfig(**base), 8, 1e-6)
    assert type(plain) is torch.nn.RMSNorm


def test_shim19_binds_every_fla_kernel_the_gdn_modules_call() -> None:
    """Every fla name a GatedDeltaNet module of this release calls is bound once shim 19 is in: None-bound ones
    (0.18-0.19) and the l2norm megatron-core 0.17 leaves unbound without fla (ssm/gated_delta_net.py:39-46, called at
    :353; bridge 0.4.x's forward raised NameError there)."""
    from convcheck.compat import no_fla

    skip_unless(optional_module("fla") is None, "a host without flash-linear-attention")
    compat.install("cpu")
    modules = no_fla._gdn_modules()
    skip_unless(bool(modules), "GatedDeltaNet")
    called = {
        (module.__name__, name)
        for module in modules
        for name in ("l2norm", "causal_conv1d", "chunk_gated_delta_rule")
        if f" {name}(" in inspect.getsource(module) or f"={name}(" in inspect.getsource(module)
    }
    assert called, "no GDN module calls an fla kernel any more: re-check shim 19"
    assert [c for c in called if getattr(optional_module(c[0]), c[1], None) is None] == []
