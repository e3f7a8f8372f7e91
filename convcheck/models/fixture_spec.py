"""FixtureSpec: one tiny HF model, as a transformers config class, overrides and a seed (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TINY_SHAPES: dict[str, Any] = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "vocab_size": 152,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
"""Small enough that every tensor holds at most 5120 elements (the distinct-value pool), large enough that
TP2 x EP2 x PP2 are all legal layouts."""


ENGINE_DIMS: dict[str, Any] = {"head_dim": 32}
"""What the `-vllm` fixtures change: CPU vLLM's attention takes head_dim 32, 64, 80, ... (not 8); q_proj [128, 32]
stays within the distinct-value pool."""


MIN_EXP, MAX_EXP = -20, 0
"""Fixture values are the finite bf16 magnitudes in [2**MIN_EXP, 2**MAX_EXP), both signs (convcheck.fixtures.values)."""
POOL_SIZE = 2 * 128 * (MAX_EXP - MIN_EXP)
"""20 exponents x 128 mantissas x 2 signs = 5120 distinct values: a tensor gets pairwise distinct values up to this."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FixtureSpec:
    """One tiny model: transformers config class + overrides, fixed seed."""

    name: str
    """Fixture name as given after `tiny:`."""
    config_class: str
    """Name of the transformers config class."""
    config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the config class."""
    seed: int = 1234
    """Seed of the value generator."""
    description: str = ""
    """One line shown by `convcheck fixtures list`."""
    fp32_tensors: tuple[str, ...] = ()
    """Name suffixes saved in float32, not bf16 (what transformers' `_keep_in_fp32_modules_strict` keeps)."""
    renames: dict[str, str] = field(default_factory=dict)
    """Tensor names rewritten after save_pretrained (where transformers writes a name published checkpoints lack)."""
    mtp_layers: int = 0
    """Multi-token-prediction layers written as `model.layers.{L + k}.*` (the last decoder layer's tensors plus
    enorm, hnorm, eh_proj, shared_head.norm / head and embed_tokens), as published DeepSeek-V3 / GLM-4.7-Flash
    checkpoints hold them: transformers builds no MTP module and save_pretrained writes none."""
    near_one_tensors: tuple[str, ...] = ()
    """Name suffixes drawn from [0.5, 2) (convcheck.fixtures.values.near_one_values): norm weights HF stores as a plain
    scale where Megatron keeps a zero-centered offset (the bridge subtracts one on import, exact only there)."""
    packed_experts: bool = False
    """Save MoE experts fused as transformers 5 holds them (`experts.gate_up_proj` / `experts.down_proj`), not split
    per expert as save_pretrained writes them: the layout of checkpoints published in that format (Qwen3.6)."""
    block_amax: int = 0
    """Draw each 2-D tensor block by block ([n, n] blocks, n = block_amax; 0: off): each block holds a permutation of
    the pool values at or below its own cap (a pool value in [0.5, 1), times 2^-k, k in 0..3), so every block has its
    own amax and a block-scaled quantizer gives every block its own scale (convcheck.fixtures.values.capped_blocks)."""
    experts_transposed: bool = False
    """With packed_experts: store the fused experts as published Qwen3-VL-MoE checkpoints do, `gate_up_proj`
    [E, H, 2F] and `down_proj` [E, F, H] (transformers 5 holds [E, 2F, H] / [E, H, F] and transposes on load)."""
    special_tokens: dict[str, int] = field(default_factory=dict)
    """Tokenizer entries named as the published tokenizer names them, with the tokenizer_config key each is read under
    (e.g. {"image_token:<image_soft_token>": 150}: id 150 is the special token `<image_soft_token>`, the tokenizer's
    `image_token`); other ids stay the word-level `w<id>`."""
    mtp_style: str = "layers"
    """How the checkpoint names its MTP layers: "layers" (DeepSeek-V3, GLM: `model.layers.{L + k}.*`, see
    mtp_layers) or "qwen" (Qwen3-Next, Qwen3.5: `mtp.fc`, `mtp.pre_fc_norm_embedding` / `_hidden`, `mtp.norm` and
    `mtp.layers.{k}.*`, a copy of the last decoder layer's tensors, which is a full-attention layer) or "nemotron"
    (Nemotron-3 Super: `mtp.layers.{d * P + i}.*` for inner layer i of a P-layer MTP pattern, with enorm / hnorm /
    eh_proj on the first and final_layernorm on the last, convcheck.fixtures.reference)."""
    clip_bounds: tuple[str, ...] = ()
    """Name suffixes of clip-bound buffers (Gemma 4's clipped linears: `input_min`, `output_max`, ...): a `*_min` drawn
    from (-2, -0.5], a `*_max` from [0.5, 2) (convcheck.fixtures.values.near_one_values, negated for a minimum), so
    every bound clips some activations and min < max; distinct values would draw empty or inverted ranges."""


def tiny_spec(name: str, config_class: str, description: str, **overrides: Any) -> FixtureSpec:
    """A fixture of TINY_SHAPES with `overrides` on top."""
    return FixtureSpec(
        name=name, config_class=config_class, config={**TINY_SHAPES, **overrides}, description=description
    )


def engine_variant(spec: FixtureSpec, description: str, **changes: Any) -> FixtureSpec:
    """`spec` as a `-vllm` fixture: its name with `-vllm`, `changes` on its config (the widths CPU vLLM's kernels
    take), everything else (knobs, fp32 tensors, MTP layers, renames) kept."""
    from dataclasses import replace

    return replace(spec, name=f"{spec.name}-vllm", description=description, config={**spec.config, **changes})
