"""Every workaround needed to run the real Megatron-Bridge on a machine without CUDA or Transformer Engine.

Each shim names the upstream file and line it targets and the version it was written for; each has a
test in tests/test_compat.py (hybrid shims: tests/test_compat_hybrid.py, tests/test_compat_hybrid_forward.py) that
fails once upstream no longer needs it. No shim changes what a mapping computes: they only route around imports and
device calls that have no CPU meaning, or (shim 10) stand in for missing mamba_ssm kernels with the same function.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

TARGET_VERSIONS = {"megatron-core": "0.19.2", "megatron-bridge": "0.6.2"}

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


def _te_stand_in_import(name: str, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
    if level == 0 and (name == "transformer_engine" or name.startswith("transformer_engine.")):
        root = _InertTE("transformer_engine")
        # `import transformer_engine.pytorch as te` binds the submodule via attribute access on the root.
        return root
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


def transformer_engine_available() -> bool:
    """True when the real Transformer Engine can be imported (then shim 1 is not installed)."""
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


def install_import_shims() -> None:
    """Install shim 1 (idempotent). Must run before megatron.bridge is imported."""
    if transformer_engine_available():
        return
    if not any(isinstance(f, _LoraLayersFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _LoraLayersFinder())


# --- Shim 2 -----------------------------------------------------------------------------------------
# megatron-bridge 0.6.2, megatron/bridge/models/conversion/param_mapping.py:1297:
# ReplicatedMapping.hf_to_megatron compares the target device with torch.cuda.current_device() whenever
# tp_size > 1 (norms, routers, biases), which raises without a CUDA driver. For a CPU target we run the same
# steps (rank > 0 gets an empty tensor, then the TP broadcast from rank 0) without the CUDA move; for any
# other target the original method runs unchanged.
def install_cpu_replicated_mapping() -> None:
    """Install shim 2 (idempotent)."""
    import torch
    from megatron.bridge.models.conversion import param_mapping

    cls = param_mapping.ReplicatedMapping
    if getattr(cls.hf_to_megatron, "_convcheck_cpu_shim", False):
        return
    original = cls.hf_to_megatron

    def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
        if hasattr(megatron_module, "weight"):
            target_device = megatron_module.weight.device
        else:
            target_device = next(megatron_module.parameters()).device
        if target_device.type != "cpu" or self.tp_size == 1:
            return original(self, hf_weights, megatron_module)
        hf_weights = hf_weights.to(device=target_device)
        if self.tp_rank > 0:
            hf_weights = torch.empty_like(hf_weights)
        return self.broadcast_tensor_to_tp_ranks(hf_weights, src_rank=0)

    hf_to_megatron._convcheck_cpu_shim = True  # type: ignore[attr-defined]
    hf_to_megatron._convcheck_original = original  # type: ignore[attr-defined]
    cls.hf_to_megatron = hf_to_megatron


# --- Shim 3 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/models/common/language_module/language_module.py:307:
# setup_embeddings_and_output_layer moves the tied embedding/output weight to CUDA (`weight.data.cuda()`)
# before all-reducing it over the embedding group whenever PP > 1 and embeddings are tied. On a machine
# without CUDA we run that method with Tensor.cuda as the identity, so the all-reduce runs on gloo over the
# CPU tensor; the values it produces are init values that the HF import overwrites either way.
def install_cpu_tied_embedding_setup() -> None:
    """Install shim 3 (idempotent); only active while CUDA is unavailable."""
    import torch
    from megatron.core.models.common.language_module.language_module import LanguageModule

    if getattr(LanguageModule.setup_embeddings_and_output_layer, "_convcheck_cpu_shim", False):
        return
    original = LanguageModule.setup_embeddings_and_output_layer

    def setup_embeddings_and_output_layer(self):  # type: ignore[no-untyped-def]
        if torch.cuda.is_available():
            return original(self)
        saved = torch.Tensor.cuda
        torch.Tensor.cuda = lambda tensor, *args, **kwargs: tensor  # type: ignore[method-assign]
        try:
            return original(self)
        finally:
            torch.Tensor.cuda = saved  # type: ignore[method-assign]

    setup_embeddings_and_output_layer._convcheck_cpu_shim = True  # type: ignore[attr-defined]
    setup_embeddings_and_output_layer._convcheck_original = original  # type: ignore[attr-defined]
    LanguageModule.setup_embeddings_and_output_layer = setup_embeddings_and_output_layer


# --- Provider settings (configuration, not patches) -------------------------------------------------
# megatron-bridge 0.6.2:
# - model_provider.py ~254 / ~315: without an initialised process group the provider starts NCCL and calls
#   torch.cuda.set_device -> convcheck.engine.dist initialises gloo and parallel_state first.
# - gpt_provider.py default_layer_spec picks the TE spec; without TE gpt_layer_specs.py:233 fails
#   ('NoneType' object is not callable) -> local_layer_spec, transformer_impl="local".
# - qwen/qwen3_moe_bridge.py:67 selects the alltoall dispatcher whose __init__ creates torch.cuda.Stream()
#   (megatron-core 0.19.2 token_dispatcher.py:469) -> "allgather" on CPU.
# - fused kernels (bias/activation/rope/softmax/cross-entropy/grad-accum) are CUDA-only -> all off.
CPU_FUSION_FIELDS = (
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "masked_softmax_fusion",
    "apply_rope_fusion",
    "persist_layer_norm",
    "cross_entropy_loss_fusion",
    "gradient_accumulation_fusion",
    "moe_permute_fusion",
    "moe_router_fusion",
)


def configure_provider(provider: Any, device: str) -> None:
    """TE-free spec when Transformer Engine is missing; on CPU also CPU init, fusions off, allgather dispatcher."""
    from megatron.bridge.models.gpt_provider import local_layer_spec

    hybrid = is_hybrid_provider(provider)
    if hybrid:
        configure_hybrid_provider(provider, device)
    if not transformer_engine_available():
        if not hybrid:
            provider.transformer_layer_spec = local_layer_spec
        provider.transformer_impl = "local"
        for name in CPU_FUSION_FIELDS:
            if hasattr(provider, name):
                setattr(provider, name, False)
    if device == "cpu":
        provider.use_cpu_initialization = True
        if getattr(provider, "num_moe_experts", None):
            provider.moe_token_dispatcher_type = "allgather"


def install(device: str = "cpu") -> None:
    """Install every shim needed for `device` ("cpu" or "cuda"); safe to call more than once."""
    install_import_shims()
    install_hybrid_shims()
    install_hybrid_forward_shims()
    if device == "cpu":
        install_cpu_replicated_mapping()
        install_cpu_tied_embedding_setup()
        install_cpu_forward_shims()


# === Forward-pass shims (logits oracle) ============================================================
# An HF-vs-Megatron forward on CPU hits more CUDA assumptions in megatron-core 0.19.2. Each shim below
# is active only while CUDA is unavailable and runs the upstream code (or its exact formula) on the CPU.


# --- Shim 4 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2 moves or allocates forward-pass tensors on torch.cuda.current_device() at the sites in
# CPU_DEVICE_SITES (module, attribute, file:line under megatron/core/): the RoPE frequencies, the attention
# matmul buffer, the router weight and the TP/EP gather/scatter outputs. Without CUDA each listed function runs
# unchanged with torch.cuda.current_device answering "cpu", so the moves are no-ops and allocations land on
# the CPU.
CPU_DEVICE_SITES = (
    (
        "megatron.core.models.common.embeddings.rotary_pos_embedding",
        "RotaryEmbedding.get_emb",
        "models/common/embeddings/rotary_pos_embedding.py:162",
    ),
    ("megatron.core.utils", "GlobalMemoryBuffer.get_tensor", "utils.py:715"),
    ("megatron.core.transformer.moe.router", "Router.gating", "transformer/moe/router.py:98"),
    ("megatron.core.tensor_parallel.mappings", "_gather_along_last_dim", "tensor_parallel/mappings.py:95"),
    ("megatron.core.tensor_parallel.mappings", "_gather_along_first_dim", "tensor_parallel/mappings.py:145"),
    ("megatron.core.tensor_parallel.mappings", "_reduce_scatter_along_first_dim", "tensor_parallel/mappings.py:185"),
)


def _on_cpu_device(original: Any) -> Any:
    """`original` run with torch.cuda.current_device() == "cpu" while CUDA is unavailable (else unchanged)."""
    import functools

    import torch

    @functools.wraps(original)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        if torch.cuda.is_available():
            return original(*args, **kwargs)
        saved = torch.cuda.current_device
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        try:
            return original(*args, **kwargs)
        finally:
            torch.cuda.current_device = saved  # type: ignore[assignment]

    wrapper._convcheck_cpu_shim = True  # type: ignore[attr-defined]
    wrapper._convcheck_original = original  # type: ignore[attr-defined]
    return wrapper


def install_cpu_device_sites() -> None:
    """Install shim 4 at every site of CPU_DEVICE_SITES (idempotent)."""
    import importlib

    for module_name, attribute, _ in CPU_DEVICE_SITES:
        owner: Any = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        current = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if not getattr(current, "_convcheck_cpu_shim", False):
            setattr(owner, name, _on_cpu_device(current))


# --- Shim 5 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/transformer/utils.py:39: get_default_causal_mask builds its mask with
# device="cuda"; the unfused softmax (fusions/fused_softmax.py:327, imported there by name) calls it when
# attention_mask is None. Without CUDA the same formula runs on the CPU: triu(ones(sq, sq), diagonal=1).bool().
def install_cpu_causal_mask() -> None:
    """Install shim 5 (idempotent) in both modules that bind the name; only active while CUDA is unavailable."""
    import torch
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils

    if getattr(utils.get_default_causal_mask, "_convcheck_cpu_shim", False):
        return
    original = utils.get_default_causal_mask

    def get_default_causal_mask(sq: int) -> torch.Tensor:
        if torch.cuda.is_available():
            return original(sq)
        return torch.triu(torch.ones(sq, sq, device="cpu"), diagonal=1).bool()

    get_default_causal_mask._convcheck_cpu_shim = True  # type: ignore[attr-defined]
    get_default_causal_mask._convcheck_original = original  # type: ignore[attr-defined]
    utils.get_default_causal_mask = get_default_causal_mask
    if fused_softmax.get_default_causal_mask is original:
        fused_softmax.get_default_causal_mask = get_default_causal_mask


# --- Shim 6 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/transformer/dot_product_attention.py:217: attention dropout runs inside
# tensor_parallel.get_cuda_rng_tracker().fork(), which reads and writes the CUDA RNG state (and raises
# "cuda rng state model-parallel-rng is not added" when no CUDA seed was set). A CPU tensor's dropout draws
# from the CPU generator, never from CUDA state, so without CUDA the fork is a no-op context.
def install_cpu_rng_fork() -> None:
    """Install shim 6 (idempotent); only active while CUDA is unavailable."""
    import contextlib

    import torch
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    if getattr(CudaRNGStatesTracker.fork, "_convcheck_cpu_shim", False):
        return
    original = CudaRNGStatesTracker.fork

    def fork(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if torch.cuda.is_available():
            return original(self, *args, **kwargs)
        return contextlib.nullcontext()

    fork._convcheck_cpu_shim = True  # type: ignore[attr-defined]
    fork._convcheck_original = original  # type: ignore[attr-defined]
    CudaRNGStatesTracker.fork = fork


def install_cpu_forward_shims() -> None:
    """Install shims 4-6 (idempotent)."""
    install_cpu_device_sites()
    install_cpu_causal_mask()
    install_cpu_rng_fork()


# === Hybrid (NemotronH / HybridModel) construction shims ===========================================
# megatron-core 0.19.2 + megatron-bridge 0.6.2 build a HybridModel only with Transformer Engine and mamba_ssm.
# The shims below let the real HybridModel be built without them (CPU, or a GPU without TE/mamba_ssm); none
# touches a parameter's name, shape or the values a mapping writes or reads. Configuration lives in
# configure_hybrid_provider.


def cpu_hybrid_stack_spec() -> Any:
    """TE-free HybridStack spec: torch norms, local linears, DotProductAttention, local (SequentialMLP) MoE.

    Replaces hybrid_layer_specs.hybrid_stack_spec (TE layers) and the modelopt local spec, whose `Norm` raises
    without TE (megatron-core 0.19.2 post_training/modelopt/layers.py:61). Parameter names are the modelopt local
    spec's: `norm.weight` (Mamba), `input_layernorm.weight` / `pre_mlp_layernorm.weight` (attention, MLP, MoE).
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
    """Install shim 7 (idempotent); only active while Transformer Engine is missing."""
    from megatron.core.models.hybrid import hybrid_block
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    cls = hybrid_block.HybridStack
    if getattr(cls.__init__, "_convcheck_cpu_shim", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if transformer_engine_available():
            return original(self, *args, **kwargs)
        saved = hybrid_block.TENorm
        hybrid_block.TENorm = WrappedTorchNorm
        try:
            return original(self, *args, **kwargs)
        finally:
            hybrid_block.TENorm = saved

    __init__._convcheck_cpu_shim = True  # type: ignore[attr-defined]
    __init__._convcheck_original = original  # type: ignore[attr-defined]
    cls.__init__ = __init__


# --- Shim 8 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/ssm/mamba_mixer.py:
# - :202 MambaMixer.__init__ raises ImportError when mamba_ssm is missing, and its gated RMSNorm (:417,
#   ExtendedRMSNorm) subclasses mamba_ssm's RMSNormGated (a MagicMock without it, :89-92);
# - :326-422 allocate conv1d/dt_bias/A_log/D/norm on torch.cuda.current_device();
# - :318 and :370 fork the CUDA RNG tracker (shim 6 makes that fork a no-op without CUDA).
# While mamba_ssm is missing, the constructor runs with HAVE_MAMBA_SSM true and ExtendedRMSNorm bound to
# CpuGatedRMSNorm (same `weight` [d_inner_local], weight sharded on axis 0 as upstream); without CUDA also with
# torch.cuda.current_device() answering "cpu". The forward still needs mamba_ssm's scan kernels.
def _gated_rms_norm_class() -> type:
    """A torch gated RMSNorm with mamba_ssm RMSNormGated's constructor and parameters (weight only)."""
    import torch

    class CpuGatedRMSNorm(torch.nn.Module):
        """y = rmsnorm_per_group(x * silu(z)) * weight (norm_before_gate=False), groups of `group_size`."""

        def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                     norm_before_gate: bool = True, device: Any = None, dtype: Any = None) -> None:  # fmt: skip
            super().__init__()
            self.eps = eps
            self.group_size = group_size or hidden_size
            self.norm_before_gate = norm_before_gate
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
            self.register_parameter("bias", None)

        def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
            dtype = x.dtype
            x = x.float()
            if z is not None and not self.norm_before_gate:
                x = x * torch.nn.functional.silu(z.float())
            groups = x.unflatten(-1, (-1, self.group_size))
            groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
            y = groups.flatten(-2) * self.weight.float()
            if z is not None and self.norm_before_gate:
                y = y * torch.nn.functional.silu(z.float())
            return y.to(dtype)

        def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
            """`weight` sharded along axis 0 over the TP group (what upstream's ExtendedRMSNorm declares)."""
            from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

            return make_sharded_tensors_for_checkpoint(
                self.state_dict(prefix="", keep_vars=True), prefix, {"weight": 0}, sharded_offsets,
                tp_group=self.tp_group, dp_cp_group=(metadata or {}).get("dp_cp_group"),
            )  # fmt: skip

    return CpuGatedRMSNorm


def install_mamba_mixer_construction() -> None:
    """Install shim 8 (idempotent); only active while mamba_ssm is missing."""
    import torch
    from megatron.core.ssm import mamba_mixer

    cls = mamba_mixer.MambaMixer
    if getattr(cls.__init__, "_convcheck_cpu_shim", False) or mamba_mixer.HAVE_MAMBA_SSM:
        return
    original = cls.__init__
    norm_cls = _gated_rms_norm_class()

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        saved = (mamba_mixer.HAVE_MAMBA_SSM, mamba_mixer.ExtendedRMSNorm, torch.cuda.current_device)
        mamba_mixer.HAVE_MAMBA_SSM, mamba_mixer.ExtendedRMSNorm = True, norm_cls
        if not torch.cuda.is_available():
            torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        try:
            return original(self, *args, **kwargs)
        finally:
            mamba_mixer.HAVE_MAMBA_SSM, mamba_mixer.ExtendedRMSNorm, torch.cuda.current_device = saved

    __init__._convcheck_cpu_shim = True  # type: ignore[attr-defined]
    __init__._convcheck_original = original  # type: ignore[attr-defined]
    cls.__init__ = __init__


# --- Shim 9 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/transformer/moe/router.py:178-194: TopKRouter.__init__ allocates the
# `local_tokens_per_expert` and `expert_bias` buffers on torch.cuda.current_device() when
# moe_router_enable_expert_bias is set (NemotronH). Without CUDA the constructor runs with
# torch.cuda.current_device() answering "cpu" (shim 4's wrapper), so both buffers are created on the CPU.
def install_cpu_router_buffers() -> None:
    """Install shim 9 (idempotent); only active while CUDA is unavailable."""
    from megatron.core.transformer.moe.router import TopKRouter

    if not getattr(TopKRouter.__init__, "_convcheck_cpu_shim", False):
        TopKRouter.__init__ = _on_cpu_device(TopKRouter.__init__)


def install_hybrid_shims() -> None:
    """Install shims 7-9 (idempotent)."""
    install_hybrid_final_norm()
    install_mamba_mixer_construction()
    install_cpu_router_buffers()


# --- Hybrid provider settings (configuration, not patches) -----------------------------------------
# megatron-bridge 0.6.2:
# - hybrid/hybrid_provider.py:91-104 get_default_hybrid_stack_spec picks the TE spec (or the modelopt spec whose
#   Norm raises without TE) -> cpu_hybrid_stack_spec while TE is missing.
# - nemotronh/nemotron_h_bridge.py sets moe_shared_expert_overlap=True; megatron-core 0.19.2
#   transformer/moe/shared_experts.py:192 then creates torch.cuda.Stream(), and the overlap needs the alltoall
#   dispatcher (transformer_config.py:1644) -> off on CPU, where the dispatcher is allgather.
def configure_hybrid_provider(provider: Any, device: str) -> None:
    """TE-free hybrid stack spec where TE is missing; on CPU no shared-expert overlap stream."""
    if not transformer_engine_available():
        provider.hybrid_stack_spec = cpu_hybrid_stack_spec
    if device == "cpu":
        provider.moe_shared_expert_overlap = False


def is_hybrid_provider(provider: Any) -> bool:
    """True for the bridge's HybridModelProvider (NemotronH and other Mamba hybrids)."""
    return hasattr(provider, "hybrid_stack_spec")


# === Hybrid (NemotronH / HybridModel) forward shims (logits oracle) ================================
# megatron-core 0.19.2's Mamba forward runs mamba_ssm's Triton scan kernels. The shim below stands in for them
# only while mamba_ssm is missing, with pure-torch code computing the same function (checked against
# transformers' NemotronH torch_forward and a step-by-step recurrence in tests/test_compat_hybrid_forward.py).


# --- Shim 10 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/ssm/mamba_mixer.py:69-79 binds mamba_chunk_scan_combined and
# mamba_split_conv1d_scan_combined to None without mamba_ssm; MambaMixer._ssm_training calls the latter at :755
# (the path of every forward outside inference mode) and _ssm_prefill the former at :1063 (static inference).
# While mamba_ssm is missing both module names are bound to torch_split_conv1d_scan / torch_chunk_scan:
# depthwise causal conv1d + SiLU, dt = softplus(dt + dt_bias) (clamped only for a non-default dt_limit), the
# chunked SSD scan in fp32 (exact intra-chunk form, states handed from chunk to chunk), the D skip and the SiLU(z)
# gate, as mamba_ssm's kernels do. Arguments they do not implement (initial states, seq_idx, final states, fused
# norm or out_proj, the non-SSM swiglu part) raise NotImplementedError instead of being ignored.
_NO_DT_LIMIT = (0.0, float("inf"))


def _reject(**arguments: Any) -> None:
    """NotImplementedError naming every argument given a value the torch stand-ins do not implement."""
    given = sorted(name for name, value in arguments.items() if value is not None and value is not False)
    if given:
        raise NotImplementedError(f"convcheck's torch Mamba scan does not implement: {', '.join(given)}")


def torch_chunk_scan(x: Any, dt: Any, A: Any, B: Any, C: Any, chunk_size: int, D: Any = None, z: Any = None,
                     dt_bias: Any = None, initial_states: Any = None, seq_idx: Any = None, cu_seqlens: Any = None,
                     dt_softplus: bool = False, dt_limit: tuple[float, float] = _NO_DT_LIMIT,
                     return_final_states: bool = False, return_varlen_states: bool = False) -> Any:  # fmt: skip
    """mamba_ssm's mamba_chunk_scan_combined in torch: y [b, l, h, p] of the selective SSM, chunk by chunk, fp32.

    x [b, l, h, p], dt [b, l, h], A [h], B/C [b, l, g, n] (head i reads group i // (h/g)), D [h] or [h, p],
    z [b, l, h, p]; state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T, y_t = state_t C_t + D x_t, times silu(z_t).
    """
    import torch
    import torch.nn.functional as F

    _reject(initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
            return_final_states=return_final_states, return_varlen_states=return_varlen_states)  # fmt: skip
    length, heads = x.shape[1], x.shape[2]
    dt = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    dt = F.softplus(dt) if dt_softplus else dt
    if tuple(dt_limit) != _NO_DT_LIMIT:
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
    import torch.nn.functional as F

    width = weight.shape[-1]
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=width - 1, groups=x.shape[1])[..., : x.shape[-1]]
    return F.silu(out) if activation in ("silu", "swish") else out


def torch_split_conv1d_scan(zxbcdt: Any, conv1d_weight: Any, conv1d_bias: Any, dt_bias: Any, A: Any, D: Any,
                            chunk_size: int, initial_states: Any = None, seq_idx: Any = None,
                            dt_limit: tuple[float, float] = _NO_DT_LIMIT, return_final_states: bool = False,
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


def install_torch_mamba_scan() -> None:
    """Install shim 10 (idempotent); only while mamba_ssm is missing (its kernels are then None upstream)."""
    from megatron.core.ssm import mamba_mixer

    if mamba_mixer.mamba_split_conv1d_scan_combined is None:
        mamba_mixer.mamba_split_conv1d_scan_combined = torch_split_conv1d_scan
    if mamba_mixer.mamba_chunk_scan_combined is None:
        mamba_mixer.mamba_chunk_scan_combined = torch_chunk_scan


def install_hybrid_forward_shims() -> None:
    """Install shim 10 (idempotent)."""
    install_torch_mamba_scan()
