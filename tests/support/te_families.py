"""Tiny checkpoints of the TE-only families (convcheck.models.te_only), written by transformers' own save_pretrained
from tiny configs (fixed seed, distinct values, bf16), cached under the cache folder by the hash of this file."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from convcheck.cache import cache_dir
from tests.support.helpers import locked

_TEXT = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=256)  # fmt: skip
_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
               deepstack_visual_indexes=[0])  # fmt: skip


def _gemma3(t: Any) -> Any:
    """Gemma3ForCausalLM: 6 layers (5 sliding-window layers of window 8, then one global), rms_norm_eps 1e-6."""
    return t.Gemma3ForCausalLM(
        t.Gemma3TextConfig(**_TEXT, intermediate_size=128, num_hidden_layers=6, sliding_window=8)
    )


def _qwen3_vl(t: Any) -> Any:
    """Qwen3VLForConditionalGeneration: a 2-layer language model and a 2-block vision tower (one deepstack merger)."""
    text = dict(_TEXT, intermediate_size=128, num_hidden_layers=2)
    return t.Qwen3VLForConditionalGeneration(t.Qwen3VLConfig(text_config=text, vision_config=_VISION))


def _qwen3_vl_moe(t: Any) -> Any:
    """Qwen3VLMoeForConditionalGeneration: 2 MoE layers of 4 experts (top 2), the same vision tower."""
    text = dict(_TEXT, intermediate_size=128, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                num_hidden_layers=2)  # fmt: skip
    return t.Qwen3VLMoeForConditionalGeneration(t.Qwen3VLMoeConfig(text_config=text, vision_config=_VISION))


def _minimax_m2(t: Any) -> Any:
    """MiniMaxM2ForCausalLM: 2 MoE layers of 4 experts (top 2), full-width q/k norms; the router's
    e_score_correction_bias kept in fp32 as the published checkpoint stores it."""
    config = t.MiniMaxM2Config(**_TEXT, intermediate_size=32, num_hidden_layers=2, num_local_experts=4,
                               num_experts_per_tok=2, eos_token_id=1, bos_token_id=0)  # fmt: skip
    return t.MiniMaxM2ForCausalLM(config)


BUILDERS: dict[str, Callable[[Any], Any]] = {
    "gemma3": _gemma3,
    "qwen3-vl": _qwen3_vl,
    "qwen3-vl-moe": _qwen3_vl_moe,
    "minimax-m2": _minimax_m2,
}
SEED = 55


def _write(name: str, folder: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(SEED)
    model = BUILDERS[name](transformers).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
        for module in model.modules():
            bias = getattr(module, "e_score_correction_bias", None)
            if isinstance(bias, torch.Tensor):
                module.e_score_correction_bias = torch.randn(bias.shape, generator=gen) * 0.05  # fp32
    model.save_pretrained(folder)


def te_family_checkpoint(name: str) -> Path:
    """The checkpoint folder of family `name` (BUILDERS), written once and cached."""
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    folder = cache_dir("te-families") / f"{name}-{digest}"
    with locked(folder.parent / f".{name}"):
        if not (folder / "config.json").exists():
            tmp = folder.with_name(folder.name + ".tmp")
            _write(name, tmp)
            tmp.rename(folder)
    return folder
