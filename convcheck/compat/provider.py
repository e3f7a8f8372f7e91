"""Provider settings for a run without TE or without CUDA: configuration of the bridge's provider, not patches."""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.gpt_provider import local_layer_spec
from megatron.bridge.models.model_provider import ModelProviderMixin
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.transformer.moe import fused_a2a

from convcheck.compat.no_te import cpu_hybrid_stack_spec, cpu_mla_decoder_block_spec, transformer_engine_available
from convcheck.compat.no_te_gdn import cpu_experimental_block_spec
from convcheck.compat.no_te_olmoe import is_olmoe_layer_spec
from convcheck.compat.te_standin import bind_te_stack_specs, te_hybrid_stack_spec

# megatron-bridge 0.6.2:
# - model_provider.py ~254 / ~315: without an initialised process group the provider starts NCCL and calls
#   torch.cuda.set_device -> convcheck.rank.dist initialises gloo and parallel_state first.
# - gpt_provider.py default_layer_spec picks the TE spec; without TE gpt_layer_specs.py:233 fails
#   ('NoneType' object is not callable) -> local_layer_spec, transformer_impl="local".
# - qwen/qwen3_moe_bridge.py:67 selects the alltoall dispatcher whose __init__ creates torch.cuda.Stream()
#   (megatron-core 0.19.2 token_dispatcher.py:469) -> "allgather" on CPU.
# - fused kernels (bias/activation/rope/softmax/cross-entropy/grad-accum) are CUDA-only -> all off.
# megatron-core 0.16.x models/backends.py:117-126: the local spec builds the legacy GroupedMLP when moe_grouped_gemm
#   is on (every Qwen3-MoE bridge sets it), whose constructor asserts the grouped_gemm package (CUDA) ->
#   moe_grouped_gemm off where that package is missing; later releases build SequentialMLP either way.
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


HYBRID_SPEC_FIELDS = ("hybrid_stack_spec", "mamba_stack_spec")
"""The provider field holding the hybrid stack spec: HybridModelProvider (bridge >= 0.6), MambaModelProvider
(<= 0.5)."""


def hybrid_spec_field(provider: ModelProviderMixin) -> str | None:
    """The stack-spec field of a hybrid provider (None for a GPT provider)."""
    return next((name for name in HYBRID_SPEC_FIELDS if hasattr(provider, name)), None)


def is_hybrid_provider(provider: ModelProviderMixin) -> bool:
    """True for the bridge's HybridModelProvider / MambaModelProvider (NemotronH and other Mamba hybrids)."""
    return hybrid_spec_field(provider) is not None


def builds_legacy_grouped_mlp() -> bool:
    """True when this megatron-core's local spec builds the legacy GroupedMLP for moe_grouped_gemm (0.16) and the
    grouped_gemm package it asserts at construction is missing."""
    import importlib.util
    import inspect

    source = inspect.getsource(LocalSpecProvider.grouped_mlp_modules)
    return "GroupedMLP," in source and importlib.util.find_spec("grouped_gemm") is None


def keeps_te_free_block_spec(spec: Any) -> bool:
    """True for a spec the bridge already built without TE that a local layer spec would lose information of:
    megatron-core's get_gpt_decoder_block_spec bound to use_transformer_engine=False (the GLM-4.5 bridge, which
    binds it to its HAVE_TE, glm/glm45_bridge.py:63: dense-first layers from moe_layer_freq, which local_layer_spec
    drops, gpt_provider.py:92-97)."""
    import functools

    return (
        isinstance(spec, functools.partial)
        and getattr(spec.func, "__name__", "") == "get_gpt_decoder_block_spec"
        and spec.keywords.get("use_transformer_engine") is False
    )


def reads_have_te(func: Any, module: Any, seen: set[str] | None = None) -> bool:
    """Whether `func` reads `module`'s global HAVE_TE, itself or through the functions of that module it calls by
    name (followed once each)."""
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    if "HAVE_TE" in code.co_names:
        return True
    seen = set() if seen is None else seen
    for name in code.co_names:
        helper = getattr(module, name, None)
        if name in seen or getattr(helper, "__module__", None) != module.__name__ or not hasattr(helper, "__code__"):
            continue
        seen.add(name)
        if reads_have_te(helper, module, seen):
            return True
    return False


def te_block_spec(spec: Any) -> Any:
    """A bridge's block spec bound to its module's HAVE_TE (False without TE: glm45_bridge.py:63,
    deepseek_v3_bridge.py:57, minimax_m3_bridge.py:307, ...), bound to the TE specs instead; a bridge's spec function
    that reads its module's HAVE_TE when called, itself (exaone_moe_provider.py:55) or through a helper of its module
    (Ernie 4.5 VL: ernie_decoder_layer_spec.py:63, _get_linear_modules, without TE a ColumnParallelLinear with no
    input norm), called with it True; any other spec unchanged."""
    import functools
    import sys

    if isinstance(spec, functools.partial) and spec.keywords.get("use_transformer_engine") is False:
        return functools.partial(spec.func, *spec.args, **{**spec.keywords, "use_transformer_engine": True})
    module = sys.modules.get(getattr(spec, "__module__", None) or "")
    if module is None or getattr(module, "HAVE_TE", None) is not False or not reads_have_te(spec, module):
        return spec

    @functools.wraps(spec)
    def with_te(*args: Any, **kwargs: Any) -> Any:
        module.HAVE_TE = True
        try:
            return spec(*args, **kwargs)
        finally:
            module.HAVE_TE = False

    return with_te


def configure_provider(provider: ModelProviderMixin, device: str, spec: str = "local") -> None:
    """TE-free spec when Transformer Engine is missing (`spec="local"`), or the bridge's own TE specs on convcheck's
    stand-in (`spec="te"`, convcheck.compat.te_standin); on CPU also CPU init, fusions off, allgather dispatcher."""
    hybrid = is_hybrid_provider(provider)
    if hybrid:
        configure_hybrid_provider(provider, device, spec)
    if not transformer_engine_available():
        if spec == "te":
            if hasattr(provider, "transformer_layer_spec"):  # a hybrid provider has a stack spec instead
                provider.transformer_layer_spec = te_block_spec(provider.transformer_layer_spec)
            bind_te_stack_specs(provider)  # FalconH1's stack spec, built from TE classes at import
        elif getattr(provider, "experimental_attention_variant", None):
            provider.transformer_layer_spec = cpu_experimental_block_spec
        elif getattr(provider, "multi_latent_attention", False):
            provider.transformer_layer_spec = cpu_mla_decoder_block_spec
        elif not hybrid and not (  # shim 24 keeps OLMoE's; GLM-4.5 brings its own TE-free block spec
            is_olmoe_layer_spec(provider.transformer_layer_spec)
            or keeps_te_free_block_spec(provider.transformer_layer_spec)
        ):
            provider.transformer_layer_spec = local_layer_spec
        provider.transformer_impl = "transformer_engine" if spec == "te" else "local"
        for name in CPU_FUSION_FIELDS:  # CUDA kernels (TE's among them); the local modules and the stand-in run unfused
            if hasattr(provider, name):
                setattr(provider, name, False)
    if device == "cpu":
        provider.use_cpu_initialization = True
        if getattr(provider, "num_moe_experts", None):
            provider.moe_token_dispatcher_type = "allgather"
            provider.moe_shared_expert_overlap = False
    if getattr(provider, "moe_token_dispatcher_type", None) == "flex" and not flex_backend_installed(provider):
        provider.moe_token_dispatcher_type = "alltoall"
    local = getattr(provider, "transformer_impl", "local") == "local"
    if getattr(provider, "moe_grouped_gemm", False) and local and builds_legacy_grouped_mlp():
        provider.moe_grouped_gemm = False


def flex_backend_installed(provider: ModelProviderMixin) -> bool:
    """Whether the package of the flex dispatcher's backend imports here (GLM-5's provider asks for HybridEP,
    glm5_bridge.py:96-97; megatron-core raises at the layer's build without it, token_dispatcher.py:1047). Without
    it the run dispatches all-to-all: the dispatcher moves tokens, not weights, and the logits oracle measures the
    forward either way."""
    backend = getattr(provider, "moe_flex_dispatcher_backend", "deepep")
    return bool(getattr(fused_a2a, "HAVE_HYBRIDEP" if backend == "hybridep" else "HAVE_DEEP_EP", False))


# megatron-bridge 0.6.2:
# - hybrid/hybrid_provider.py:91-104 get_default_hybrid_stack_spec picks the TE spec (or the modelopt spec whose
#   Norm raises without TE) -> cpu_hybrid_stack_spec while TE is missing; bridge 0.3.0-0.5.1 build NemotronH through
#   mamba/mamba_provider.py MambaModelProvider, whose `mamba_stack_spec` field plays that part.
def configure_hybrid_provider(provider: ModelProviderMixin, device: str, spec: str = "local") -> None:
    """TE-free hybrid stack spec where TE is missing (the bridge's own with `spec="te"`); on CPU no shared-expert
    overlap stream."""
    field = hybrid_spec_field(provider) or HYBRID_SPEC_FIELDS[0]
    if spec == "te" and not transformer_engine_available():
        setattr(provider, field, te_hybrid_stack_spec())
    elif not transformer_engine_available():
        setattr(provider, field, cpu_hybrid_stack_spec)
    if device == "cpu":
        provider.moe_shared_expert_overlap = False
