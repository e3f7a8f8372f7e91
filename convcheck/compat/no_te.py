"""What exists because Transformer Engine is missing: the TE import stand-in (shim 1), the TE-free hybrid stack
spec, the hybrid final norm (shim 7) and the torch-Adam `step` on a reshardable resume (shim 13).
Delete this module once the bridge and megatron-core build without TE."""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

from convcheck.compat._patch import _patch


def transformer_engine_available() -> bool:
    """True when the real Transformer Engine can be imported (then nothing here is installed)."""
    return importlib.util.find_spec("transformer_engine") is not None


# --- Shim 1 -----------------------------------------------------------------------------------------
# megatron-bridge 0.6.2, megatron/bridge/peft/lora_layers.py:20 does `import transformer_engine.pytorch as te`
# unconditionally (reached from auto_bridge.py:40 -> model_bridge.py:56 -> conversion/peft_bridge.py:41 ->
# peft/canonical_lora.py:26). Module-level uses are annotations only (te.ops.Sequential). We give ONLY that
# module an inert stand-in through a private __import__ while its body executes; nothing enters sys.modules,
# so megatron.core keeps HAVE_TE=False.
LORA_LAYERS_MODULE = "megatron.bridge.peft.lora_layers"


class _InertTE(types.ModuleType):
    """Stand-in for transformer_engine attributes used at import time; any call fails loudly."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _InertTE(f"{self.__name__}.{name}")
        setattr(self, name, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__} is convcheck's inert Transformer Engine stand-in; TE is not installed")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


def _te_stand_in_import(name: str, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and (name == "transformer_engine" or name.startswith("transformer_engine.")):
        # `import transformer_engine.pytorch as te` binds the submodule via attribute access on the root.
        return _InertTE("transformer_engine")
    return builtins.__import__(name, globals, locals, fromlist, level)


class _LoraLayersLoader(importlib.abc.Loader):
    """Executes the real lora_layers source with the TE stand-in visible to that module alone."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        private_builtins = dict(vars(builtins))
        private_builtins["__import__"] = _te_stand_in_import
        module.__dict__["__builtins__"] = private_builtins
        try:
            self.inner.exec_module(module)
        finally:
            module.__dict__["__builtins__"] = builtins


class _LoraLayersFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that wraps the loader of megatron.bridge.peft.lora_layers only."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != LORA_LAYERS_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoraLayersLoader(spec.loader)
        return spec


def install_import_shims() -> None:
    """Install shim 1 (idempotent) while TE is missing. Must run before megatron.bridge is imported."""
    if transformer_engine_available():
        return
    if not any(isinstance(f, _LoraLayersFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _LoraLayersFinder())


# --- TE-free hybrid stack spec (set by convcheck.compat.provider while TE is missing) ----------------
# megatron-bridge 0.6.2 hybrid/hybrid_provider.py:91-104 picks the TE spec, or the modelopt local spec whose `Norm`
# raises without TE (megatron-core 0.19.2 post_training/modelopt/layers.py:61).
def cpu_hybrid_stack_spec() -> Any:
    """TE-free HybridStack spec: torch norms, local linears, DotProductAttention, local (SequentialMLP) MoE.

    Parameter names are the modelopt local spec's: `norm.weight` (Mamba), `input_layernorm.weight` /
    `pre_mlp_layernorm.weight` (attention, MLP, MoE).
    """
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.models.hybrid.hybrid_block import HybridStack, HybridStackSubmodules
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    bda = get_bias_dropout_add
    mamba = ModuleSpec(
        module=MambaLayer,
        submodules=MambaLayerSubmodules(
            norm=WrappedTorchNorm,
            mixer=ModuleSpec(
                module=MambaMixer,
                submodules=MambaMixerSubmodules(in_proj=ColumnParallelLinear, out_proj=RowParallelLinear),
            ),
            mamba_bda=bda,
        ),
    )
    attention = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=ColumnParallelLinear, core_attention=DotProductAttention, linear_proj=RowParallelLinear
                ),
            ),
            self_attn_bda=bda,
        ),
    )
    mlp = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=ModuleSpec(
                module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
            ),
            mlp_bda=bda,
        ),
    )
    moe = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=get_moe_module_spec(use_te=False, num_experts=8, moe_grouped_gemm=False),  # any num_experts > 0
            mlp_bda=bda,
        ),
    )
    return ModuleSpec(
        module=HybridStack,
        submodules=HybridStackSubmodules(mamba_layer=mamba, attention_layer=attention, mlp_layer=mlp, moe_layer=moe),
    )


# --- Shim 7 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/models/hybrid/hybrid_block.py:215: HybridStack.__init__ builds the final norm
# with TENorm whatever the spec says (TENorm raises without TE). While TE is missing, the constructor runs with
# the module's TENorm name bound to megatron-core's WrappedTorchNorm (torch.nn.RMSNorm / LayerNorm, parameter
# `final_norm.weight` as with TENorm).
def install_hybrid_final_norm() -> None:
    """Install shim 7 (idempotent) while TE is missing."""
    if transformer_engine_available():
        return
    from megatron.core.models.hybrid import hybrid_block
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    def torch_final_norm(original: Any) -> Any:
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            saved = hybrid_block.TENorm
            hybrid_block.TENorm = WrappedTorchNorm
            try:
                return original(self, *args, **kwargs)
            finally:
                hybrid_block.TENorm = saved

        return __init__

    _patch(hybrid_block.HybridStack, "__init__", torch_final_norm)


def install() -> None:
    """Install shims 1 and 7 (idempotent; shim 13 is installed where the optimizer is built). Shim 1 comes first."""
    install_import_shims()
    install_hybrid_final_norm()


# --- Shim 13 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/optimizer/distrib_optimizer.py:1219: without Apex or TE the distributed
# optimizer runs torch's Adam, whose state holds a tensor `step` (put there by load_state_dict, :1026-1032).
# _set_main_param_and_optimizer_states copies every tensor state from `tensors`, but the fully_reshardable loader
# leaves `step` out of them (:2390), so every resume raises KeyError: 'step'. While Apex and TE are missing, the
# copy runs with `step` given as None, which upstream skips; the step itself was already restored at :1031.
def install_torch_adam_step() -> None:
    """Install shim 13 (idempotent) while megatron-core's distributed optimizer runs without Apex and TE."""
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return

    def step_left_to_load_state_dict(original: Any) -> Any:
        def _set_main_param_and_optimizer_states(self, model_param, tensors):  # type: ignore[no-untyped-def]
            if "step" not in tensors:
                tensors = {**tensors, "step": None}
            return original(self, model_param, tensors)

        return _set_main_param_and_optimizer_states

    _patch(distrib_optimizer.DistributedOptimizer, "_set_main_param_and_optimizer_states", step_left_to_load_state_dict)
