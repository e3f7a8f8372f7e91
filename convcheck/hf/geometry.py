"""Geometry: the shapes of a decoder-only HF config, the one reader shared by layouts, mappings and config rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class Geometry:
    """The shapes a mapping or a layout check needs; 0 (or empty) where the HF config does not say."""

    hidden: int = 0
    num_heads: int = 0
    num_query_groups: int = 0
    """KV heads (GQA groups); the number of heads when the config names none."""
    head_dim: int = 0
    vocab: int = 0
    padded_vocab: int = 0
    """Megatron's embedding rows (vocab, or vocab padded by the provider)."""
    num_layers: int = 0
    """Decoder layers: num_hidden_layers, else the length of a hybrid model's layer list or pattern."""
    ffn: int = 0
    """Dense MLP width (intermediate_size)."""
    num_experts: int = 0
    moe_ffn: int = 0
    """Expert MLP width (moe_intermediate_size)."""
    layer_types: tuple[str, ...] = ()
    """Per-layer block types of a hybrid model (NemotronH `layers_block_type`), empty for other models."""
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_groups: int = 0
    mamba_state: int = 0
    q_lora_rank: int = 0
    """Multi-latent attention: rank of the query LoRA (0 where q_lora_rank is None: a plain q_proj)."""
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    """Per-head query/key channels without RoPE."""
    qk_rope_head_dim: int = 0
    """Per-head query channels with RoPE (and the width of the one RoPE key all heads share)."""
    v_head_dim: int = 0
    mtp_layers: int = 0
    """Multi-token prediction layers (num_nextn_predict_layers); HF numbers MTP layer k model.layers.{L + k}."""
    mtp_layer_types: tuple[str, ...] = ()
    """NemotronH: the block types of one MTP block (`mtp_layers_block_type`, or the letters of
    `mtp_hybrid_override_pattern`); HF numbers inner layer i of block d `mtp.layers.{d * P + i}`, P their number."""
    linear_key_heads: int = 0
    """Gated DeltaNet (Qwen3-Next linear attention): key heads (linear_num_key_heads)."""
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    """Channels per GDN key (and query) head."""
    linear_value_dim: int = 0
    linear_conv_kernel: int = 0
    """Width of the GDN causal depthwise conv1d over the [q, k, v] channels."""
    attention_output_gate: bool = False
    """q_proj holds a sigmoid output gate per head, `[heads * 2 * head_dim, hidden]` (Qwen3-Next, Qwen3.5)."""
    vision_heads: int = 0
    """Vision tower attention heads (a vision-language config's vision_config.num_heads; 0 without one)."""
    vision_head_dim: int = 0
    """Vision tower channels per head (vision_config.hidden_size / num_heads)."""
    fused_experts_as_linear: bool = False
    """Checkpoint side, not config: its fused expert tensors are stored in nn.Linear's orientation (`gate_up_proj`
    `[E, 2F, hidden]`, as transformers 5's save_pretrained writes Qwen3-VL-MoE's), not transposed as published
    Qwen3-VL-MoE checkpoints store them (convcheck.mappings.fused_experts.stored_as_linear)."""
    attention_types: tuple[str, ...] = ()
    """Per-layer attention kinds (`layer_types`: "sliding_attention" / "full_attention"), empty where not given."""
    global_head_dim: int = 0
    """Gemma 4: channels per head of the full-attention layers (global_head_dim; 0: head_dim everywhere)."""
    global_query_groups: int = 0
    """Gemma 4: KV heads of the full-attention layers (num_global_key_value_heads; 0: num_query_groups)."""
    k_eq_v: bool = False
    """Gemma 4: the full-attention layers use their keys as values and store no v_proj (attention_k_eq_v)."""
    kv_shared_layers: int = 0
    """Gemma 4: the last N layers reuse an earlier layer's keys and values and store no k/v projections."""
    double_wide_mlp: bool = False
    """Gemma 4: the KV-shared layers' MLPs are twice intermediate_size wide (use_double_wide_mlp)."""
    te_spec: bool = False
    """Megatron side, not HF: the model was built from the Transformer Engine layer specs (transformer_impl
    "transformer_engine"), where MLA's q / kv down projections are TELinear duplicated on every TP rank
    (megatron-core 0.19.2 multi_latent_attention.py:525, :573) instead of column-parallel."""

    def is_full_attention(self, layer: int) -> bool:
        """Whether 0-based `layer` is a full-attention layer of a sliding / full pattern (False without one)."""
        return layer < len(self.attention_types) and self.attention_types[layer] == "full_attention"

    def shares_kv(self, layer: int) -> bool:
        """Whether 0-based `layer` reuses an earlier layer's keys and values (Gemma 4's last kv_shared_layers)."""
        return self.kv_shared_layers > 0 and layer >= self.num_layers - self.kv_shared_layers

    def ffn_of(self, layer: int) -> int:
        """The dense MLP width of 0-based `layer`: twice ffn in a double-wide KV-shared layer, else ffn."""
        return 2 * self.ffn if self.double_wide_mlp and self.shares_kv(layer) else self.ffn

    @property
    def has_mamba_layers(self) -> bool:
        """True when some layer of a hybrid model is a Mamba mixer."""
        return any("mamba" in kind for kind in self.layer_types)

    def missing_for_mappings(self) -> tuple[str, ...]:
        """HF fields every explicit mapping needs that this geometry lacks (empty when a registry can be built)."""
        needed = {"hidden_size": self.hidden, "num_attention_heads": self.num_heads, "vocab_size": self.vocab}
        return tuple(name for name, value in needed.items() if not value)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], *, padded_vocab: int | None = None) -> Geometry:
        """Read an HF config dict; nested `text_config` wins: each quantity is the first integer found under its
        names in `text_config`, else at the top level (bools, floats and strings count as absent)."""
        sources = _sources(config)
        hidden = _integer(sources, "hidden_size")
        heads = _integer(sources, "num_attention_heads", "n_head")
        vocab = _integer(sources, "vocab_size")
        layer_list = _sequence(sources, "layers_block_type")
        pattern = layer_list or _sequence(sources, "hybrid_override_pattern")
        vision = config.get("vision_config")
        vision = (vision,) if isinstance(vision, Mapping) else ()
        vision_heads = _integer(vision, "num_heads")
        attention = _sequence(sources, "layer_types")
        return cls(
            hidden=hidden,
            num_heads=heads,
            num_query_groups=_integer(sources, "num_key_value_heads") or heads,
            head_dim=_integer(sources, "head_dim") or (hidden // heads if hidden and heads else 0),
            vocab=vocab,
            padded_vocab=padded_vocab or vocab,
            num_layers=_integer(sources, "num_hidden_layers", "n_layer") or len(pattern),
            ffn=_integer(sources, "intermediate_size"),
            # n_routed_experts first: transformers 5.12.1's GlmMoeDsaConfig also declares num_experts=256, a default
            # its modeling never reads (it builds n_routed_experts experts), so a config it writes holds both
            num_experts=_integer(sources, "n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"),
            moe_ffn=_integer(sources, "moe_intermediate_size"),
            layer_types=tuple(str(kind) for kind in layer_list) if isinstance(layer_list, list) else (),
            mamba_heads=_integer(sources, "mamba_num_heads"),
            mamba_head_dim=_integer(sources, "mamba_head_dim"),
            mamba_groups=_integer(sources, "n_groups"),
            mamba_state=_integer(sources, "ssm_state_size"),
            q_lora_rank=_integer(sources, "q_lora_rank"),
            kv_lora_rank=_integer(sources, "kv_lora_rank"),
            qk_nope_head_dim=_integer(sources, "qk_nope_head_dim"),
            qk_rope_head_dim=_integer(sources, "qk_rope_head_dim"),
            v_head_dim=_integer(sources, "v_head_dim"),
            mtp_layers=_integer(sources, "num_nextn_predict_layers"),
            mtp_layer_types=_mtp_layer_types(sources),
            linear_key_heads=_integer(sources, "linear_num_key_heads"),
            linear_value_heads=_integer(sources, "linear_num_value_heads"),
            linear_key_dim=_integer(sources, "linear_key_head_dim"),
            linear_value_dim=_integer(sources, "linear_value_head_dim"),
            linear_conv_kernel=_integer(sources, "linear_conv_kernel_dim"),
            attention_output_gate=_output_gate(sources),
            vision_heads=vision_heads,
            vision_head_dim=_integer(vision, "hidden_size") // vision_heads if vision_heads else 0,
            attention_types=tuple(str(kind) for kind in attention) if isinstance(attention, list) else (),
            global_head_dim=_integer(sources, "global_head_dim"),
            global_query_groups=_integer(sources, "num_global_key_value_heads"),
            k_eq_v=_flag(sources, "attention_k_eq_v"),
            kv_shared_layers=_integer(sources, "num_kv_shared_layers"),
            double_wide_mlp=_flag(sources, "use_double_wide_mlp"),
        )


HYBRID_LETTERS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
"""A NemotronH pattern letter -> its block type (transformers' NemotronHConfig._pattern_to_list)."""


def _mtp_layer_types(sources: tuple[Mapping[str, Any], ...]) -> tuple[str, ...]:
    """NemotronH MTP block types: `mtp_layers_block_type` (transformers 5), else `mtp_hybrid_override_pattern`'s
    letters (published config.json); empty without MTP layers."""
    if not _integer(sources, "num_nextn_predict_layers"):
        return ()
    types = _sequence(sources, "mtp_layers_block_type")
    if isinstance(types, list) and types:
        return tuple(str(kind) for kind in types)
    pattern = _sequence(sources, "mtp_hybrid_override_pattern")
    return tuple(HYBRID_LETTERS.get(char, char) for char in pattern) if isinstance(pattern, str) else ()


def _sources(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """Where fields are looked up, in precedence order: a nested text_config first, then the top level; a speech-out
    model (Qwen2.5-Omni, Qwen3-Omni: the bridge converts its thinker) reads its thinker's text_config and thinker."""
    thinker = config.get("thinker_config")
    if isinstance(thinker, Mapping):
        return (*_sources(thinker), config)
    text = config.get("text_config")
    return (text, config) if isinstance(text, Mapping) else (config,)


OUTPUT_GATE_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
"""Model types whose attention always gates its output (transformers 5.12.1 modeling_qwen3_next.py:295 chunks
q_proj's output per head into [query; gate]); their configs name no field for it."""


def _output_gate(sources: tuple[Mapping[str, Any], ...]) -> bool:
    """An explicit attention_output_gate / attn_output_gate bool, else whether the model type always gates."""
    for source in sources:
        for name in ("attention_output_gate", "attn_output_gate"):
            if isinstance(source.get(name), bool):
                return bool(source[name])
    return any(source.get("model_type") in OUTPUT_GATE_MODEL_TYPES for source in sources)


def _flag(sources: tuple[Mapping[str, Any], ...], name: str) -> bool:
    """The first bool under `name`, source by source; False when there is none."""
    for source in sources:
        if isinstance(source.get(name), bool):
            return bool(source[name])
    return False


def _integer(sources: tuple[Mapping[str, Any], ...], *names: str) -> int:
    """The first integer under any of `names`, source by source; 0 when there is none."""
    for source in sources:
        for name in names:
            value = source.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return 0


def _sequence(sources: tuple[Mapping[str, Any], ...], name: str) -> list[Any] | str:
    """The first non-empty list or string under `name`, source by source; empty when there is none."""
    for source in sources:
        value = source.get(name)
        if isinstance(value, (list, str)) and value:
            return value
    return []
