"""Transformer Engine's norms in torch: `RMSNorm`, `LayerNorm` (TE 2.20.2 `pytorch/module/rmsnorm.py`, `layernorm.py`
over `pytorch/ops/basic/rmsnorm.py`, `layer_norm.py`) and megatron-core's `TENorm` factory that picks one
(`megatron/core/extensions/transformer_engine.py:796`).

Parameters as TE registers them: `weight` [hidden] (and `bias` [hidden] for LayerNorm), in the dtype asked for
(megatron-core passes config.params_dtype), ones (zeros with zero-centered gamma) and zeros at init, each with the
legacy `sequence_parallel` attribute. Forward as TE's kernels compute it: the input cast to the weight's dtype,
normalized in fp32, scaled by gamma (`1 + gamma` when zero-centered), returned in the weight's dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from convcheck.kernels.te.rules import ParamRule, TeSource

NORM_DTYPE_RULE = "dtype"
"""TE's norms take `dtype` (megatron-core's `_get_extra_te_kwargs` passes `params_dtype`, which TE renames)."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * gamma over the last dim, in fp32, returned in weight's dtype; gamma is
    `1 + weight` when zero-centered. x [..., hidden], weight [hidden]."""
    x32 = x.to(weight.dtype).float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (weight.float() + 1.0 if zero_centered else weight.float())).to(weight.dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, zero_centered: bool) -> Any:
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim (biased variance), in fp32, returned in
    weight's dtype. x [..., hidden], weight / bias [hidden]."""
    x32 = x.to(weight.dtype).float()
    mean = x32.mean(-1, keepdim=True)
    y = (x32 - mean) * torch.rsqrt((x32 - mean).pow(2).mean(-1, keepdim=True) + eps)
    gamma = weight.float() + 1.0 if zero_centered else weight.float()
    return (y * gamma + bias.float()).to(weight.dtype)


class _Norm(torch.nn.Module):
    """What TE's RMSNorm and LayerNorm share: `weight` [hidden] (ones, zeros with zero-centered gamma) and, with
    `bias`, `bias` [hidden] (zeros), in `dtype` (torch's default when None), each with the legacy sequence_parallel
    attribute when given."""

    def __init__(self, normalized_shape: int, eps: float, sequence_parallel: bool | None, zero_centered_gamma: bool,
                 dtype: torch.dtype | None, device: torch.device | str | None, bias: bool) -> None:  # fmt: skip
        super().__init__()
        self.eps = eps
        self.zero_centered_gamma = zero_centered_gamma
        self.sequence_parallel = sequence_parallel
        self.normalized_shape = (int(normalized_shape),)
        dtype = dtype or torch.get_default_dtype()
        init = torch.zeros if zero_centered_gamma else torch.ones
        self.weight = torch.nn.Parameter(init(self.normalized_shape, dtype=dtype, device=device))
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(self.normalized_shape, dtype=dtype, device=device))
        for param in self.parameters() if sequence_parallel is not None else ():
            param.sequence_parallel = sequence_parallel


class RMSNorm(_Norm):
    """transformer_engine.pytorch.RMSNorm: `weight` [hidden]; the bridge maps it as replicated by its class name."""

    TE_SOURCE = TeSource("transformer_engine/pytorch/ops/basic/rmsnorm.py", "RMSNorm")
    TE_PARAMETERS = (ParamRule("weight", ("normalized_shape",), NORM_DTYPE_RULE),)

    def __init__(self, normalized_shape: int, eps: float = 1e-5, sequence_parallel: bool | None = None,
                 zero_centered_gamma: bool = False, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:  # fmt: skip
        super().__init__(normalized_shape, eps, sequence_parallel, zero_centered_gamma, dtype, device, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.zero_centered_gamma)


class LayerNorm(_Norm):
    """transformer_engine.pytorch.LayerNorm: `weight`, `bias` [hidden]."""

    TE_SOURCE = TeSource("transformer_engine/pytorch/ops/basic/layer_norm.py", "LayerNorm")
    TE_PARAMETERS = (
        ParamRule("weight", ("normalized_shape",), NORM_DTYPE_RULE),
        ParamRule("bias", ("normalized_shape",), NORM_DTYPE_RULE),
    )

    def __init__(self, normalized_shape: int, eps: float = 1e-5, sequence_parallel: bool | None = None,
                 zero_centered_gamma: bool = False, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:  # fmt: skip
        super().__init__(normalized_shape, eps, sequence_parallel, zero_centered_gamma, dtype, device, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps, self.zero_centered_gamma)


def te_device(config: Any) -> str:
    """Where megatron-core's `_get_extra_te_kwargs` (extensions/transformer_engine.py:403) puts TE parameters: the
    CPU with use_cpu_initialization, meta with init_model_with_meta_device, else the current CUDA device; the CPU
    where CUDA is unavailable (a vision tower's config the bridge builds without use_cpu_initialization, e.g. Gemma 3's
    and EXAONE 4.5's, on a CPU run)."""
    if config.use_cpu_initialization:
        return "cpu"
    if config.init_model_with_meta_device:
        return "meta"
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{torch.cuda.current_device()}"


class TENorm:
    """megatron-core's TENorm: a TE `LayerNorm` or `RMSNorm` per config.normalization (eps, zero-centered gamma,
    sequence_parallel and params_dtype from the config). The fused residual RMSNorm is not stood in for."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, has_residual: bool = False) -> Any:
        if getattr(config, "fused_residual_rmsnorm", False) and has_residual:  # a config field from megatron-core 0.17
            raise NotImplementedError("convcheck's Transformer Engine stand-in has no fused residual RMSNorm")
        kinds = {"LayerNorm": LayerNorm, "RMSNorm": RMSNorm}
        if config.normalization not in kinds:
            raise Exception("Only LayerNorm and RMSNorm are currently supported")
        return kinds[config.normalization](
            hidden_size,
            eps=eps,
            sequence_parallel=config.sequence_parallel,
            zero_centered_gamma=config.layernorm_zero_centered_gamma,
            dtype=config.params_dtype,
            device=te_device(config),
        )
