"""`--hook` for tests/test_deepseek.py: an MLA layout bug planted in the real bridge's AutoMapping in every decoder
layer and in the MTP layer, made identically in import and export (convcheck.mutants.mla's row permutation of the
whole HF tensor), so a roundtrip cannot see it."""

from __future__ import annotations

from typing import Any

from convcheck.mutants.mla import _permute_hf_rows

KV_DOWN = "self_attention.linear_kv_down_proj.weight"
LAYERS = (*(f"decoder.layers.{i}" for i in range(4)), "mtp.layers.0.mtp_model_layer")
"""The tiny DeepSeek-V3 fixture's 4 decoder layers and its MTP layer."""


def _latent_cut_at_nope(config: Any, rows: int) -> Any:
    """kv_a_proj_with_mqa rows [kv_lora_rank; rope] with the latent cut after qk_head_dim rows (the no-RoPE head
    width, 12, where kv_lora_rank is 16): [latent[:12]; rope; latent[12:]]."""
    import torch

    cut, latent = config.qk_head_dim, config.kv_lora_rank
    return torch.cat([torch.arange(cut), torch.arange(latent, rows), torch.arange(cut, latent)])


def kv_a_latent_cut_at_nope() -> None:
    """Every layer's linear_kv_down_proj takes the KV latent's boundary at qk_head_dim, not kv_lora_rank."""
    for layer in LAYERS:
        _permute_hf_rows(f"{layer}.{KV_DOWN}", _latent_cut_at_nope)
