"""Every workaround needed to run the real Megatron-Bridge on a machine without CUDA or Transformer Engine.

Each shim names the upstream file and line it targets and the version it was written for; each has a
test in tests/test_compat.py that fails once upstream no longer needs it. No shim changes what a
mapping computes: they only route around imports and device calls that have no CPU meaning.
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

    if not transformer_engine_available():
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
