"""What exists because Transformer Engine is missing, for megatron-core's experimental-attention hybrids (Qwen3-Next,
Qwen3.5: gated DeltaNet + gated attention): a TE-free block spec (shim 20) and a zero-centered RMSNorm for the torch
norm fallback (shim 21). Delete this module once megatron-core builds these models without TE."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.layers import ColumnParallelLinear

from convcheck.compat._patch import _patch
from convcheck.compat.detect import optional_module, skip
from convcheck.compat.no_te import transformer_engine_available
from convcheck.kernels.norms import ZeroCenteredRMSNorm

EXPERIMENTAL_SPECS = "megatron.core.models.gpt.experimental_attention_variant_module_specs"


# --- Shim 20 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, models/gpt/experimental_attention_variant_module_specs.py:
# - :442 _get_backend_spec_provider asserts transformer_impl == "transformer_engine" (TESpecProvider);
# - :474 _get_self_attention_module_spec takes the full-attention layers from the TE layer spec.
# The bridges pass get_transformer_block_with_experimental_attention_variant_spec (qwen3_next_bridge.py:84,
# qwen35_bridge.py:301). convcheck's TE-free spec runs that same upstream function (per-layer attention and MoE
# patterns, GDN spec, PP slicing, final norm) with a local backend that, like TE's, fuses the input norm into the
# following column-parallel linear: a torch norm + ColumnParallelLinear holding `layer_norm_weight` (replicated, as
# TE's LayerNormColumnParallelLinear), and for the full-attention layers the local gated self-attention with that
# fused linear_qkv. Parameter names are TE's (`self_attention.in_proj.layer_norm_weight`,
# `self_attention.linear_qkv.layer_norm_weight`, `mlp.linear_fc1.layer_norm_weight`), which the bridges map; the
# local layout's separate input_layernorm has no mapping in the bridge's MTP table (`mtp.layers.0...` has no `*` for
# the mapping_registry.py:75 alias).
_FUSED: dict[str, type] = {}


def norm_column_linear() -> type:
    """A torch LayerNormColumnParallelLinear: y = ColumnParallelLinear(norm(x)), norm an RMSNorm (zero-centered when
    the config says so) or LayerNorm over the input's last dim with weight `layer_norm_weight` [in_features]."""
    if "class" not in _FUSED:

        class TorchLayerNormColumnParallelLinear(ColumnParallelLinear):
            """ColumnParallelLinear after a norm of its input (the norm's weight replicated over TP). Its name holds
            `LayerNormColumnParallelLinear`: the bridge's AutoMapping dispatches on it (param_mapping.py:1434)."""

            def __init__(self, input_size: int, output_size: int, *, config: Any, **kwargs: Any) -> None:
                super().__init__(input_size, output_size, config=config, **kwargs)
                if config.normalization not in ("RMSNorm", "LayerNorm"):
                    raise NotImplementedError(f"convcheck's fused norm + linear has no {config.normalization}")
                self.norm_kind = config.normalization
                self.zero_centered = bool(config.layernorm_zero_centered_gamma)
                self.norm_eps = config.layernorm_epsilon
                init = torch.zeros if self.zero_centered else torch.ones
                self.layer_norm_weight = torch.nn.Parameter(init(input_size, dtype=config.params_dtype))
                if self.norm_kind == "LayerNorm":
                    self.layer_norm_bias = torch.nn.Parameter(torch.zeros(input_size, dtype=config.params_dtype))

            def forward(self, input_: Any, *args: Any, **kwargs: Any) -> Any:
                x = input_.float()
                if self.norm_kind == "RMSNorm":
                    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.norm_eps)
                else:
                    y = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(
                        x.var(-1, keepdim=True, unbiased=False) + self.norm_eps
                    )
                scale = self.layer_norm_weight.float() + (1.0 if self.zero_centered else 0.0)
                y = y * scale
                if self.norm_kind == "LayerNorm":
                    y = y + self.layer_norm_bias.float()
                return super().forward(y.type_as(input_), *args, **kwargs)

        _FUSED["class"] = TorchLayerNormColumnParallelLinear
    return _FUSED["class"]


def cpu_experimental_block_spec(config: Any, vp_stage: int | None = None, pp_rank: int | None = None) -> Any:
    """The bridge's experimental-attention block spec (GDN or gated attention per layer, dense or MoE per layer),
    built with local modules under TE's parameter names."""
    module = optional_module(EXPERIMENTAL_SPECS)
    if module is None:
        raise RuntimeError("this megatron-core has no experimental attention variant specs")
    with _local_backend(module):
        return module.get_transformer_block_with_experimental_attention_variant_spec(
            config, vp_stage=vp_stage, pp_rank=pp_rank
        )


@contextlib.contextmanager
def _local_backend(module: ModuleType) -> Iterator[None]:
    """The spec module's two TE-only steps bound to local equivalents inside the block."""
    fused = norm_column_linear()

    class FusedNormLocalBackend(LocalSpecProvider):
        """megatron-core's local backend with the input norm fused into the next column-parallel linear."""

        def fuse_layernorm_and_linear(self) -> bool:
            return True

        def column_parallel_layer_norm_linear(self) -> type:
            return fused

    def local_attention(config: Any, backend: Any = None) -> Any:
        layer = get_gpt_layer_local_spec(
            num_experts=None, qk_layernorm=config.qk_layernorm, normalization=config.normalization,
            qk_l2_norm=config.qk_l2_norm,
        )  # fmt: skip
        attention = layer.submodules.self_attention
        attention.submodules.linear_qkv = fused
        attention.metainfo = {**attention.metainfo, "fuse_input_layernorm": True}
        return attention

    saved = {name: getattr(module, name) for name in ("_get_backend_spec_provider", "_get_self_attention_module_spec")}
    module._get_backend_spec_provider = lambda config: FusedNormLocalBackend()
    module._get_self_attention_module_spec = local_attention
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


# --- Shim 21 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, transformer/torch_norm.py:43: WrappedTorchNorm (the local backend's norm, and what the
# no-TE MTP block uses for enorm / hnorm / final_layernorm) asserts not layernorm_zero_centered_gamma, which the
# Qwen3-Next and Qwen3.5 bridges set (qwen3_next_bridge.py:79, qwen35_bridge.py:57). While TE is missing a
# zero-centered RMSNorm config gets convcheck.kernels.norms.ZeroCenteredRMSNorm: the same `weight` [hidden] (zeros
# at init, as TE's zero_centered_gamma keeps it), y = x / rms(x) * (1 + weight) in fp32, in x's dtype. Every other
# config goes to the upstream constructor unchanged.
class TorchRMSNormZeroCentered(ZeroCenteredRMSNorm):
    """ZeroCenteredRMSNorm under the class name of the torch.nn.RMSNorm WrappedTorchNorm returns: the bridge's
    AutoMapping finds a module's parallelism by class name (param_mapping.py:1425, "RMSNorm": replicated)."""


TorchRMSNormZeroCentered.__name__ = TorchRMSNormZeroCentered.__qualname__ = "RMSNorm"


def install_zero_centered_norm() -> None:
    """Install shim 21 (idempotent) while TE is missing."""
    if transformer_engine_available():
        return
    torch_norm = optional_module("megatron.core.transformer.torch_norm")
    if torch_norm is None or not hasattr(torch_norm, "WrappedTorchNorm"):
        skip(21, "this megatron-core has no transformer/torch_norm.py WrappedTorchNorm")
        return

    def zero_centered(original: Any) -> Any:
        def __new__(cls, config, hidden_size, eps=1e-5, *args, **kwargs):  # type: ignore[no-untyped-def]
            if config.layernorm_zero_centered_gamma and config.normalization == "RMSNorm":
                return TorchRMSNormZeroCentered(hidden_size, eps=eps)
            return original(cls, config, hidden_size, eps, *args, **kwargs)

        return staticmethod(__new__)

    _patch(torch_norm.WrappedTorchNorm, "__new__", zero_centered)


def install() -> None:
    """Install shim 21 (shim 20 is the spec the provider gets)."""
    install_zero_centered_norm()
