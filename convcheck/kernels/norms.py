"""Norms megatron-core's torch fallback (WrappedTorchNorm) lacks, in pure torch."""

from __future__ import annotations

import torch


class ZeroCenteredRMSNorm(torch.nn.Module):
    """RMSNorm whose scale is stored as an offset from one: y = x / rms(x) * (1 + weight), computed in fp32 and
    returned in x's dtype (Transformer Engine's zero_centered_gamma RMSNorm; HF's Qwen3NextRMSNorm). weight [hidden]."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:  # fmt: skip
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)
