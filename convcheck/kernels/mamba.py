"""Mamba-2 kernels in pure torch computing what mamba_ssm's do: the chunked SSD scan, the depthwise causal conv1d
and the gated RMSNorm (tested in tests/test_compat_hybrid_forward.py); arguments they do not implement raise."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

NO_DT_LIMIT = (0.0, float("inf"))


def _reject(**arguments: Any) -> None:
    """NotImplementedError naming every argument given a value the torch stand-ins do not implement."""
    given = sorted(name for name, value in arguments.items() if value is not None and value is not False)
    if given:
        raise NotImplementedError(f"convcheck's torch Mamba scan does not implement: {', '.join(given)}")


def torch_chunk_scan(x: Any, dt: Any, A: Any, B: Any, C: Any, chunk_size: int, D: Any = None, z: Any = None,
                     dt_bias: Any = None, initial_states: Any = None, seq_idx: Any = None, cu_seqlens: Any = None,
                     dt_softplus: bool = False, dt_limit: tuple[float, float] = NO_DT_LIMIT,
                     return_final_states: bool = False, return_varlen_states: bool = False) -> Any:  # fmt: skip
    """mamba_ssm's mamba_chunk_scan_combined in torch: y [b, l, h, p] of the selective SSM, chunk by chunk, fp32.

    x [b, l, h, p], dt [b, l, h], A [h], B/C [b, l, g, n] (head i reads group i // (h/g)), D [h] or [h, p],
    z [b, l, h, p]; state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T, y_t = state_t C_t + D x_t, times silu(z_t).
    """
    _reject(initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
            return_final_states=return_final_states, return_varlen_states=return_varlen_states)  # fmt: skip
    length, heads = x.shape[1], x.shape[2]
    dt = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    dt = F.softplus(dt) if dt_softplus else dt
    if tuple(dt_limit) != NO_DT_LIMIT:
        dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
    repeat = heads // B.shape[2]
    pad = (-length) % chunk_size

    def chunked(t: Any) -> Any:  # [b, l, ...] -> [b, chunks, chunk_size, ...], zero-padded
        return F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)).unflatten(1, (-1, chunk_size))

    xdt = chunked(x.float() * dt[..., None])  # [b, c, L, h, p]
    Bh = chunked(B.float().repeat_interleave(repeat, dim=2))  # [b, c, L, h, n]
    Ch = chunked(C.float().repeat_interleave(repeat, dim=2))
    log_a = chunked(dt * A.float()).cumsum(dim=2)  # [b, c, L, h]: sum of dt*A from the chunk start
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()[:, :, None]
    gaps = (log_a[:, :, :, None] - log_a[:, :, None]).masked_fill(~causal, float("-inf"))  # [b, c, t, s, h]
    y = torch.einsum("bcthn,bcshn,bctsh,bcshp->bcthp", Ch, Bh, gaps.exp(), xdt)  # within the chunk
    to_end = (log_a[:, :, -1:] - log_a).exp()  # [b, c, L, h]
    chunk_states = torch.einsum("bcsh,bcshn,bcshp->bchpn", to_end, Bh, xdt)
    entering, state = [], torch.zeros_like(chunk_states[:, 0])
    for c in range(chunk_states.shape[1]):
        entering.append(state)
        state = log_a[:, c, -1].exp()[..., None, None] * state + chunk_states[:, c]
    y = y + torch.einsum("bcthn,bchpn,bcth->bcthp", Ch, torch.stack(entering, dim=1), log_a.exp())
    y = y.flatten(1, 2)[:, :length]
    if D is not None:
        y = y + x.float() * (D.float()[:, None] if D.dim() == 1 else D.float())
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)


def torch_causal_conv1d(x: Any, weight: Any, bias: Any, activation: str | None) -> Any:
    """Depthwise causal conv over time: x [b, d, l], weight [d, w] -> [b, d, l] (SiLU for "silu"/"swish")."""
    width = weight.shape[-1]
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=width - 1, groups=x.shape[1])[..., : x.shape[-1]]
    return F.silu(out) if activation in ("silu", "swish") else out


def torch_split_conv1d_scan(zxbcdt: Any, conv1d_weight: Any, conv1d_bias: Any, dt_bias: Any, A: Any, D: Any,
                            chunk_size: int, initial_states: Any = None, seq_idx: Any = None,
                            dt_limit: tuple[float, float] = NO_DT_LIMIT, return_final_states: bool = False,
                            activation: str = "silu", rmsnorm_weight: Any = None, rmsnorm_eps: float = 1e-6,
                            outproj_weight: Any = None, outproj_bias: Any = None, headdim: int | None = None,
                            ngroups: int = 1, norm_before_gate: bool = True) -> Any:  # fmt: skip
    """mamba_ssm's mamba_split_conv1d_scan_combined in torch: zxbcdt [b, l, z|xBC|dt] -> silu(z)-gated y [b, l, h*p]."""
    _reject(initial_states=initial_states, seq_idx=seq_idx, return_final_states=return_final_states,
            rmsnorm_weight=rmsnorm_weight, outproj_weight=outproj_weight, outproj_bias=outproj_bias)  # fmt: skip
    heads, headdim = (D.shape[0], headdim) if D.dim() == 1 else D.shape
    dim = heads * headdim
    state = (conv1d_weight.shape[0] - dim) // ngroups // 2
    if zxbcdt.shape[-1] != 2 * dim + 2 * ngroups * state + heads:
        _reject(non_ssm_swiglu_part=True)
    z, xbc, dt = zxbcdt.split([dim, dim + 2 * ngroups * state, heads], dim=-1)
    xbc = torch_causal_conv1d(xbc.transpose(1, 2), conv1d_weight, conv1d_bias, activation).transpose(1, 2)
    x, B, C = xbc.split([dim, ngroups * state, ngroups * state], dim=-1)
    y = torch_chunk_scan(x.unflatten(-1, (heads, headdim)), dt, A, B.unflatten(-1, (ngroups, state)),
                         C.unflatten(-1, (ngroups, state)), chunk_size, D=D, z=z.unflatten(-1, (heads, headdim)),
                         dt_bias=dt_bias, dt_softplus=True, dt_limit=dt_limit)  # fmt: skip
    return y.flatten(-2)


class GatedRMSNorm(torch.nn.Module):
    """y = rmsnorm_per_group(x * silu(z)) * weight (norm_before_gate=False), groups of `group_size` channels;
    constructor and parameters (`weight` only) as mamba_ssm's RMSNormGated, formula as HF's Zamba2RMSNormGated."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                 norm_before_gate: bool = True, device: Any = None, dtype: Any = None) -> None:  # fmt: skip
        super().__init__()
        self.eps = eps
        self.group_size = group_size or hidden_size
        self.norm_before_gate = norm_before_gate
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """Normalise x per group (gated by silu(z) before or after, as configured), in fp32; result in x's dtype."""
        dtype = x.dtype
        x = x.float()
        if z is not None and not self.norm_before_gate:
            x = x * F.silu(z.float())
        groups = x.unflatten(-1, (-1, self.group_size))
        groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
        y = groups.flatten(-2) * self.weight.float()
        if z is not None and self.norm_before_gate:
            y = y * F.silu(z.float())
        return y.to(dtype)
