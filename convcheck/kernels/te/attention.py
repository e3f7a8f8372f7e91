"""megatron-core's `TEDotProductAttention` (megatron/core/extensions/transformer_engine.py:1770) in torch, computing
what TE 2.20.2's `DotProductAttention` computes (pytorch/attention/dot_product_attention/dot_product_attention.py:854;
the math of its unfused backend, backends.py:375, and its masks, utils.py:1977 `get_full_mask`).

The options megatron-core passes: GQA (`num_gqa_groups` = config.num_query_groups; each KV head serves
heads / groups query heads), `softmax_scale` (default 1 / sqrt(k_channels)), the mask type (causal, no_mask,
padding, arbitrary, causal_bottom_right), the sliding window of layers `is_layer_window_attention` selects
(query i sees keys [i - left, i + right], aligned top-left for causal, bottom-right for causal_bottom_right),
MLA's separate `k_channels` / `v_channels`, a post-scale attention bias, and `softmax_type` off-by-one / learnable:
an extra logit per head (0, or the `softmax_offset` parameter [heads / tp], fp32 as TE allocates it) joins the
softmax and is dropped after it (attention sinks). Scores are q k^T x scale in the inputs' dtype, the softmax in
fp32, the probabilities back in the inputs' dtype before they weight v; dropout only while training. Context
parallelism, qk-clip and softcapping are not stood in for (they raise). Packed sequences (`qkv_format` "thd",
query / key / value `[t, heads, dim]`, as the Qwen3-VL vision tower passes its images) run the same math on each
sequence `[cu_seqlens[i], cu_seqlens[i + 1])` alone and return `[t, heads x v_channels]`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core.parallel_state import get_tensor_model_parallel_group
from megatron.core.transformer.utils import is_layer_window_attention
from megatron.core.utils import get_pg_size

from convcheck.kernels.te.rules import ParamRule, TeSource


def window_mask(sq: int, sk: int, window: tuple[int, int] | None, mask_type: str) -> torch.Tensor:
    """TE's sliding-window / causal mask [sq, sk], True where a key is hidden (utils.py:2061-2110): query i sees key
    j when j in [i - left, i + right] (shifted by sk - sq for bottom-right alignment); causal forces right = 0,
    -1 means unbounded."""
    left, right = window if window is not None else (-1, -1)
    if "causal" in mask_type:
        right = 0
    left, right = (sk if left == -1 else left), (sq if right == -1 else right)
    shift = sk - sq if mask_type == "causal_bottom_right" else 0
    diff = torch.arange(sq).view(sq, 1) + shift - torch.arange(sk).view(1, sk)  # i - j
    return ~((diff <= left) & (diff >= -right))


class TEDotProductAttention(torch.nn.Module):
    """Core attention on [s, b, heads, dim] query / key / value; returns [sq, b, heads x v_channels]."""

    TE_SOURCE = TeSource(
        "transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py", "DotProductAttention"
    )
    TE_PARAMETERS = (ParamRule("softmax_offset", ("num_attention_heads // tp_size",), None),)

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 k_channels: int | None = None, v_channels: int | None = None, num_splits: int | None = None,
                 cp_comm_type: str | None = "p2p", pg_collection: Any = None) -> None:  # fmt: skip

        super().__init__()
        for flag in ("qk_clip", "log_max_attention_logit"):
            if getattr(config, flag, False):
                raise NotImplementedError(f"convcheck's Transformer Engine stand-in does not support {flag}")
        if config.context_parallel_size > 1:
            raise NotImplementedError("convcheck's Transformer Engine stand-in does not support context parallelism")
        self.config = config
        self.qkv_format = "sbhd"
        tp_group = pg_collection.tp if pg_collection is not None else get_tensor_model_parallel_group(False)
        self._tp_group = tp_group
        self.tp_size = get_pg_size(tp_group)
        self.layer_number = layer_number
        self.attention_type = attention_type
        self.attn_mask_type = attn_mask_type.name
        self.num_attention_heads = config.num_attention_heads
        self.num_gqa_groups = config.num_query_groups
        kv = (k_channels, v_channels) if k_channels is not None and v_channels is not None else config.kv_channels
        self.hidden_size_per_attention_head_k = kv if isinstance(kv, int) else kv[0]
        self.hidden_size_per_attention_head_v = kv if isinstance(kv, int) else kv[1]
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(self.hidden_size_per_attention_head_k)
        window = config.window_size if is_layer_window_attention(
            config.window_size, config.window_attn_skip_freq, layer_number) else None  # fmt: skip
        self.window_size = tuple(window) if window is not None else None
        self.attention_dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_type = config.softmax_type
        device = "cpu" if config.use_cpu_initialization else None
        if self.softmax_type == "learnable":
            heads = self.num_attention_heads // self.tp_size
            self.softmax_offset = torch.nn.Parameter(torch.zeros(heads, device=device))
        elif self.softmax_type == "off-by-one":
            self.softmax_offset = torch.zeros(self.num_attention_heads // self.tp_size, device=device)
        else:
            self.softmax_offset = None

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
        """The learnable softmax offset split along dim 0 over TP (nothing otherwise)."""
        from convcheck.kernels.te.checkpoint import tp_sharded

        if self.softmax_type != "learnable":
            return {}
        return tp_sharded(self, {"softmax_offset": 0}, prefix, sharded_offsets, metadata)

    def _packed(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask_type: Any,
                packed: Any) -> torch.Tensor:  # fmt: skip
        """THD: query `[t, heads, dk]`, key / value `[t, groups, d]`; each sequence of `cu_seqlens_q` /
        `cu_seqlens_kv` attends within itself (as sbhd with batch 1) -> `[t, heads x dv]`."""
        if getattr(packed, "qkv_format", "thd") != "thd" or query.dim() != 3:
            raise NotImplementedError("convcheck's Transformer Engine stand-in supports packed sequences in thd only")
        bounds_q = [int(x) for x in packed.cu_seqlens_q]
        bounds_kv = [int(x) for x in packed.cu_seqlens_kv]
        parts = []
        for i in range(len(bounds_q) - 1):
            q = query[bounds_q[i] : bounds_q[i + 1]].unsqueeze(1)
            k = key[bounds_kv[i] : bounds_kv[i + 1]].unsqueeze(1)
            v = value[bounds_kv[i] : bounds_kv[i + 1]].unsqueeze(1)
            parts.append(self.forward(q, k, v, None, attn_mask_type).squeeze(1))
        return torch.cat(parts, dim=0)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any, attention_bias: torch.Tensor | None = None, packed_seq_params: Any = None,
                num_splits: int | None = None) -> torch.Tensor:  # fmt: skip
        if packed_seq_params is not None:
            return self._packed(query, key, value, attn_mask_type, packed_seq_params)
        mask_type = attn_mask_type.name if attn_mask_type is not None else self.attn_mask_type
        sq, batch, heads, _ = query.shape
        sk, groups = key.shape[0], key.shape[2]
        if groups != heads:  # GQA: each KV head serves heads / groups query heads (backends.py:623-631)
            key = key.repeat_interleave(heads // groups, dim=2)
            value = value.repeat_interleave(heads // groups, dim=2)
        q = query.reshape(sq, batch * heads, -1).transpose(0, 1)  # [b * h, sq, dk]
        k = key.reshape(sk, batch * heads, -1).transpose(0, 1).transpose(1, 2)  # [b * h, dk, sk]
        scores = torch.baddbmm(q.new_empty(batch * heads, sq, sk), q, k, beta=0.0, alpha=self.softmax_scale)
        scores = scores.view(batch, heads, sq, sk)
        if attention_bias is not None:  # post_scale_bias
            scores = scores + attention_bias
        hidden = window_mask(sq, sk, self.window_size, mask_type).to(scores.device).view(1, 1, sq, sk)
        if ("padding" in mask_type or mask_type == "arbitrary") and attention_mask is not None:
            hidden = hidden | attention_mask.bool()
        scores = scores.float().masked_fill(hidden, -10000.0)
        if self.softmax_offset is not None:
            sink = self.softmax_offset.float().view(1, heads, 1, 1).expand(batch, heads, sq, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        if self.training and self.attention_dropout > 0:
            probs = torch.nn.functional.dropout(probs, p=self.attention_dropout)
        v = value.reshape(sk, batch * heads, -1).transpose(0, 1)  # [b * h, sk, dv]
        context = torch.bmm(probs.to(v.dtype).reshape(batch * heads, sq, sk), v)  # [b * h, sq, dv]
        return context.view(batch, heads, sq, -1).permute(2, 0, 1, 3).reshape(sq, batch, -1)
