"""`--hook`s of tests/test_te_families.py: bugs planted in the real bridge's mappings of the TE-only families (a post
norm loaded from a pre norm's HF tensor), and the fix of the Gemma 3 post-norm epsilon bug."""

from __future__ import annotations

from typing import Any

GEMMA3_SWAPS = {
    "decoder.layers.0.self_attention.linear_proj.post_layernorm.weight": (
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
    ),
    "decoder.layers.0.mlp.linear_fc1.layer_norm_weight": ("pre_feedforward_layernorm", "post_attention_layernorm"),
}
"""Gemma 3: layer 0's post-attention norm (inside TERowParallelLinearLayerNorm) <-> its pre-MLP norm."""
MINIMAX_SWAPS = {
    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight": ("input_layernorm", "post_attention_layernorm"),
    "decoder.layers.0.pre_mlp_layernorm.weight": ("post_attention_layernorm", "input_layernorm"),
}
"""MiniMax-M2 (a MoE layer: its pre-MLP norm is a TENorm of its own): layer 0's input norm <-> post-attention norm."""
QWEN3_VL_SWAPS = {
    "language_model.decoder.layers.0.self_attention.linear_qkv.layer_norm_weight": (
        "input_layernorm",
        "post_attention_layernorm",
    ),
    "language_model.decoder.layers.0.mlp.linear_fc1.layer_norm_weight": ("post_attention_layernorm", "input_layernorm"),
}
"""Qwen3-VL's language model: layer 0's input norm <-> post-attention norm."""


def _swap_on_import(swaps: dict[str, tuple[str, str]]) -> None:
    """While load_weights_hf_to_megatron builds its conversion tasks, the bridge maps each Megatron parameter of
    `swaps` to the HF tensor named with the part replaced; the export maps them right, so it writes each norm's
    values under the other's name."""
    from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    state = {"loading": False}
    resolve, load = AutoMapping.resolve, MegatronModelBridge.load_weights_hf_to_megatron

    def swapped_resolve(self: Any, captures: Any) -> Any:
        mapping = resolve(self, captures)
        swap = swaps.get(mapping.megatron_param) if state["loading"] else None
        if swap is None:
            return mapping
        return type(mapping)(mapping.megatron_param, mapping.hf_param.replace(*swap), mapping.permute_dims)

    def loading(self: Any, *args: Any, **kwargs: Any) -> Any:
        state["loading"] = True
        try:
            return load(self, *args, **kwargs)
        finally:
            state["loading"] = False

    AutoMapping.resolve, MegatronModelBridge.load_weights_hf_to_megatron = swapped_resolve, loading


def swap_gemma3_norms_on_import() -> None:
    _swap_on_import(GEMMA3_SWAPS)


def swap_minimax_norms_on_import() -> None:
    _swap_on_import(MINIMAX_SWAPS)


def swap_qwen3_vl_norms_on_import() -> None:
    _swap_on_import(QWEN3_VL_SWAPS)


def post_norm_eps_fixed() -> None:
    """te-post-layernorm-default-eps fixed: TERowParallelLinearLayerNorm's post norm built with the config's
    layernorm_epsilon (what megatron-core's own layers pass their TENorm)."""
    from convcheck.compat.te_standin import install_te_standin

    install_te_standin()
    from megatron.bridge.models.common import te_layers

    cls = te_layers.TERowParallelLinearLayerNorm
    init = cls.__init__

    def fixed(self: Any, input_size: int, output_size: int, *, config: Any, **kwargs: Any) -> None:
        init(self, input_size, output_size, config=config, **kwargs)
        self.post_layernorm = te_layers.TENorm(config, output_size, eps=config.layernorm_epsilon)

    cls.__init__ = fixed


def shim28_removed() -> None:
    """MiniMax-M2's q/k norm import as upstream wrote it (shim 28 undone): it moves the weight to CUDA at TP > 1."""
    from megatron.bridge.models.minimax_m2.minimax_m2_bridge import _FullDimQKNormMapping

    from convcheck import compat

    _FullDimQKNormMapping.hf_to_megatron = compat.upstream(_FullDimQKNormMapping.hf_to_megatron)


def built(ctx: Any) -> dict[str, Any]:
    """Class names and bases of layer 0's modules (the bridge's TE-derived classes rebuilt on the stand-in)."""
    chunk = ctx.model[0]
    while hasattr(chunk, "module"):
        chunk = chunk.module
    layer = chunk.decoder.layers[0]
    return {
        name: [c.__module__ + "." + c.__qualname__ for c in type(m).__mro__[:3]]
        for name, m in layer.named_modules()
        if name in ("self_attention.linear_proj", "self_attention.core_attention", "mlp.linear_fc2")
    } | {"post_norm_eps": layer.self_attention.linear_proj.post_layernorm.eps}
