"""Planted gated-DeltaNet bugs (Qwen3-Next, Qwen3.5): `convcheck verify --hook convcheck.mutants.gdn:NAME` runs one
in every rank.

Each patches a real Megatron-Bridge object: the GDN conv1d / in_proj mappings and their split helpers, the
zero-centered norm mapping, the gated-attention QKV split, or the provider's layer schedule.
"""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion import param_mapping
from megatron.bridge.models.conversion.param_mapping import GDNConv1dMapping, RMSNorm2ZeroCenteredRMSNormMapping

from convcheck.mutants.patch import alter_provider, wrap


def conv1d_not_deinterleaved() -> None:
    """GDNConv1dMapping's export takes each TP rank's conv1d shard as one block: the HF conv1d holds
    [q0 k0 v0 q1 k1 v1] instead of [q0 q1 k0 k1 v0 v1] at TP2 (the import is right)."""

    def make(original: Any) -> Any:
        def get_shard_idx(self, config, local_tp):  # type: ignore[no-untyped-def]
            chunks = original(self, config, local_tp)
            return [torch.cat(list(chunks))] if local_tp else chunks

        return get_shard_idx

    wrap(GDNConv1dMapping, "get_shard_idx", make)


def _split_module() -> Any:
    return param_mapping


def ba_swapped_in_split() -> None:
    """split_gdn_linear_weights hands back in_proj's b rows where a belongs and a where b belongs (export only):
    Qwen3-Next's in_proj_ba holds [a; b] per key head, Qwen3.5's in_proj_b / in_proj_a trade places."""
    module = _split_module()
    original = module.split_gdn_linear_weights

    def split_gdn_linear_weights(provider, in_proj, tp_size=1, feature_dim=None):  # type: ignore[no-untyped-def]
        qkvz, ba = original(provider, in_proj, tp_size=tp_size, feature_dim=feature_dim)
        per_group = provider.linear_num_value_heads // provider.linear_num_key_heads
        grouped = ba.reshape(provider.linear_num_key_heads, 2 * per_group, -1)
        b, a = torch.split(grouped, [per_group, per_group], dim=1)
        return qkvz, torch.cat([a, b], dim=1).reshape(ba.shape)

    module.split_gdn_linear_weights = split_gdn_linear_weights


def _norm_mapping() -> Any:
    return RMSNorm2ZeroCenteredRMSNormMapping


def _in_layer(mapping: Any, layer: int) -> bool:
    return mapping.megatron_param.startswith(f"decoder.layers.{layer}.")


def norm_offset_twice() -> None:
    """RMSNorm2ZeroCenteredRMSNormMapping's export adds its +1 twice in layer 2 (the import is right)."""

    def make(original: Any) -> Any:
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            return {n: t + 1 for n, t in out.items()} if _in_layer(self, 2) else out

        return megatron_to_hf

    wrap(_norm_mapping(), "megatron_to_hf", make)


def norm_offset_sign_flipped() -> None:
    """The gated norm offset has the wrong sign both ways: the import stores HF + 1, the export subtracts 1 (a
    roundtrip sees only bf16 rounding; the loaded norm's gamma is off by 2)."""

    def make_import(original: Any) -> Any:
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            return original(self, hf_weights + 2, megatron_module)

        return hf_to_megatron

    def make_export(original: Any) -> Any:
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            return {n: t - 2 for n, t in original(self, megatron_weights, megatron_module).items()}

        return megatron_to_hf

    wrap(_norm_mapping(), "hf_to_megatron", make_import)
    wrap(_norm_mapping(), "megatron_to_hf", make_export)


def norm_elements_reversed() -> None:
    """Layer 1's gated norm export writes its elements in reverse order (after its +1; the import is right)."""

    def make(original: Any) -> Any:
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            return {n: t.flip(0) for n, t in out.items()} if _in_layer(self, 1) else out

        return megatron_to_hf

    wrap(_norm_mapping(), "megatron_to_hf", make)


def gate_off_by_one_head() -> None:
    """split_qkv_weights pairs head h's query with head h+1's output gate in q_proj (attention_output_gate, export
    only): HF q_proj's [q_h; gate_h] blocks hold [q_h; gate_(h+1)]."""
    module = _split_module()
    original = module.split_qkv_weights

    def split_qkv_weights(provider, qkv, feature_dim=None):  # type: ignore[no-untyped-def]
        q, k, v = original(provider, qkv, feature_dim=feature_dim)
        if not getattr(provider, "attention_output_gate", False):
            return q, k, v
        heads = provider.num_attention_heads
        blocks = q.reshape(heads, 2, -1)
        gates = torch.roll(blocks[:, 1], shifts=-1, dims=0)
        return torch.stack([blocks[:, 0], gates], dim=1).reshape(q.shape), k, v

    module.split_qkv_weights = split_qkv_weights


SCHEDULE_INTERVAL = 4
"""The interval full_attention_interval_from_hf falls back to for a config without one (transformers_compat.py)."""


def schedule_as_interval() -> None:
    """The provider gets a full-attention interval instead of the per-layer schedule: linear_attention_freq = 4
    (layers [linear, linear, linear, full]) where the config's layer_types say [full, linear, linear, full]."""

    def change(provider: Any) -> None:
        if isinstance(getattr(provider, "linear_attention_freq", None), list):
            provider.linear_attention_freq = SCHEDULE_INTERVAL

    alter_provider(change)
