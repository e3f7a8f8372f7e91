"""Planted DeepSeek-V3-family bugs (MLA, shared experts, expert bias, MTP, dense-first layers):
`convcheck verify --hook convcheck.mutants.mla:NAME` runs one in every rank.

The attention bugs permute whole HF tensors symmetrically (import and export alike), so a roundtrip cannot see
them: the mapping and logits oracles must.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
from megatron.bridge.models.conversion.param_mapping import AutoMapping
from megatron.bridge.models.conversion.utils import unwrap_model

from convcheck.mutants.patch import alter_provider, wrap

RowOrder = Callable[[Any, int], Any]
"""(the provider, rows of the full HF tensor) -> index tensor of the rows the bridge stores in their place."""


def _permute_hf_rows(target: str, order: RowOrder) -> None:
    """AutoMapping of Megatron parameter `target` imports HF rows[order] and exports them back through the inverse:
    a full-tensor layout bug under any TP split (the permutation acts before the scatter and after the gather)."""
    providers: list[Any] = []
    alter_provider(providers.append)  # every rank builds the provider: its widths serve ranks without the module

    def make_import(original: Any) -> Any:
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            if self.megatron_param == target and hf_weights is not None:
                hf_weights = hf_weights[order(providers[-1], hf_weights.shape[0])].contiguous()
            return original(self, hf_weights, megatron_module)

        return hf_to_megatron

    def make_export(original: Any) -> Any:
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            if self.megatron_param != target:
                return out
            inverse = {n: torch.argsort(order(providers[-1], t.shape[0])) for n, t in out.items()}
            return {n: t[inverse[n]].contiguous() for n, t in out.items()}

        return megatron_to_hf

    wrap(AutoMapping, "hf_to_megatron", make_import)
    wrap(AutoMapping, "megatron_to_hf", make_export)


def _rope_rows_first(config: Any, rows: int) -> Any:
    """kv_a_proj_with_mqa rows [kv_lora_rank; qk_rope_head_dim] stored as [qk_rope_head_dim; kv_lora_rank]."""
    split = config.kv_lora_rank
    assert rows == split + config.qk_pos_emb_head_dim, rows
    return torch.cat([torch.arange(split, rows), torch.arange(split)])


def kv_a_split_offset() -> None:
    """Layer 1's kv_a_proj_with_mqa is split at qk_rope_head_dim, not kv_lora_rank: Megatron's compressed kv gets
    the rope rows first (import and export alike)."""
    _permute_hf_rows("decoder.layers.1.self_attention.linear_kv_down_proj.weight", _rope_rows_first)


def _v_before_k_nope(config: Any, rows: int) -> Any:
    """kv_b_proj rows per head [k_nope; v] stored as [v; k_nope] (rows = heads x (qk_head_dim + v_head_dim))."""
    nope, v = config.qk_head_dim, config.v_head_dim
    heads = rows // (nope + v)
    assert heads * (nope + v) == rows, rows
    one = torch.cat([torch.arange(nope, nope + v), torch.arange(nope)])
    return torch.cat([one + h * (nope + v) for h in range(heads)])


def kv_b_k_nope_v_swapped() -> None:
    """Layer 0's kv_b_proj is read per head as [v; k_nope] instead of [k_nope; v] (import and export alike)."""
    _permute_hf_rows("decoder.layers.0.self_attention.linear_kv_up_proj.weight", _v_before_k_nope)


def _rename_stream(rename: Callable[[Any, str], str | None]) -> None:
    """Wrap the bridge's export stream: each name becomes rename(megatron config, name); None drops the tensor."""

    def make(original: Any) -> Any:
        def stream(self, megatron_model, *args, **kwargs):  # type: ignore[no-untyped-def]
            chunks = megatron_model if isinstance(megatron_model, list) else [megatron_model]
            config = unwrap_model(chunks)[0].config
            for name, tensor in original(self, megatron_model, *args, **kwargs):
                renamed = rename(config, name)
                if renamed is not None:
                    yield renamed, tensor

        return stream

    wrap(MegatronModelBridge, "stream_weights_megatron_to_hf", make)


def shared_expert_as_routed0() -> None:
    """The export writes layer 1's shared expert under routed expert 0's names (and drops expert 0 itself)."""

    def rename(_config: Any, name: str) -> str | None:
        if name.startswith("model.layers.1.mlp.experts.0."):
            return None
        return name.replace("model.layers.1.mlp.shared_experts.", "model.layers.1.mlp.experts.0.")

    _rename_stream(rename)


def mtp_index_off_by_one() -> None:
    """The export numbers MTP layer k as model.layers.{L + k + 1} instead of model.layers.{L + k}."""
    import re

    def rename(config: Any, name: str) -> str:
        match = re.match(r"model\.layers\.(\d+)\.", name)
        if match is None or int(match.group(1)) < config.num_layers:
            return name
        return f"model.layers.{int(match.group(1)) + 1}." + name[match.end() :]

    _rename_stream(rename)


def dense_first_as_moe() -> None:
    """The provider makes every layer MoE: the dense-first layers' pattern (first_k_dense_replace) is lost."""

    def change(provider: Any) -> None:
        if isinstance(provider.moe_layer_freq, list) and 0 in provider.moe_layer_freq:
            provider.moe_layer_freq = [1] * len(provider.moe_layer_freq)

    alter_provider(change)


def routed_scaling_lost() -> None:
    """Kimi-K2's routed_scaling_factor lost: the provider leaves moe_router_topk_scaling_factor None, so the routed
    experts' weighted sum is not scaled by 2.827 (the config the bridge hands Megatron-Core, and the forward)."""
    alter_provider(lambda p: setattr(p, "moe_router_topk_scaling_factor", None) if p.num_moe_experts else None)
