"""Gated-DeltaNet kernels in pure torch computing what flash-linear-attention's do for megatron-core's GatedDeltaNet:
the depthwise causal conv1d with its activation and the L2 norm over the head dim (tested in
tests/test_compat_gdn.py). The chunked gated delta rule itself is megatron-core's own torch_chunk_gated_delta_rule."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def torch_causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                        activation: str | None = None, initial_state: Any = None, output_final_state: bool = False,
                        cu_seqlens: Any = None, **unused: Any) -> tuple[torch.Tensor, None]:  # fmt: skip
    """fla's causal_conv1d in torch: x [b, s, d], weight [d, w] -> (y [b, s, d], None); y_t = act(sum_j w[:, j] *
    x_{t - w + 1 + j} + bias), zero history, computed in x's dtype as megatron-core's deterministic path does."""
    unsupported = (("initial_state", initial_state), ("output_final_state", output_final_state),
                   ("cu_seqlens", cu_seqlens))  # fmt: skip
    given = [name for name, value in unsupported if value is not None and value is not False]
    if given:
        raise NotImplementedError(f"convcheck's torch causal_conv1d does not implement: {', '.join(given)}")
    length, channels, width = x.shape[1], weight.shape[0], weight.shape[1]
    y = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=width - 1, groups=channels)[..., :length]
    if activation in ("silu", "swish"):
        y = F.silu(y)
    elif activation is not None:
        raise NotImplementedError(f"convcheck's torch causal_conv1d does not implement activation {activation!r}")
    return y.transpose(1, 2), None


def torch_l2norm(x: torch.Tensor, eps: float = 1e-6, output_dtype: torch.dtype | None = None) -> torch.Tensor:
    """fla's l2norm in torch: x / sqrt(sum(x^2) + eps) over the last dim, in fp32, returned in x's dtype."""
    x32 = x.float()
    y = x32 * torch.rsqrt((x32 * x32).sum(dim=-1, keepdim=True) + eps)
    return y.to(output_dtype or x.dtype)
