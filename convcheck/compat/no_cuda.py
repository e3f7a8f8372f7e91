"""What exists because this run has no CUDA device: shims 2-6, 9, 11, 12, 18, 22, 23 and 27-29, installed and active
exactly when the run's requested device is "cpu", whatever the host has. Each runs the upstream code (or its exact
formula) on the CPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion import param_mapping
from megatron.core.fusions import fused_softmax
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
from megatron.core.transformer import utils

from convcheck.compat._patch import _patch, shims_on
from convcheck.compat.detect import has_attr, optional_module, site_present, skip

_state = {"active": False}


def active() -> bool:
    """True while the no-CUDA shims route to the CPU (the run asked for device "cpu")."""
    return _state["active"]


def set_active(on: bool) -> None:
    """Route the installed no-CUDA shims to the CPU (True) or let every one run upstream unchanged (False)."""
    _state["active"] = bool(on)


@contextlib.contextmanager
def cpu_current_device() -> Iterator[None]:
    """torch.cuda.current_device() answers "cpu" inside the block, so upstream moves are no-ops and allocations
    land on the CPU."""
    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.current_device = saved  # type: ignore[assignment]


def _on_cpu_device(original: Any) -> Any:
    """`original` run with torch.cuda.current_device() == "cpu" while the shims are active (else unchanged)."""
    import functools

    @functools.wraps(original)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not active():
            return original(*args, **kwargs)
        with cpu_current_device():
            return original(*args, **kwargs)

    return wrapper


_ON_CPU = f"{_on_cpu_device.__module__}.{_on_cpu_device.__qualname__}"
"""The shim name _patch gives the _on_cpu_device wrapper."""


def _resolve(owner: Any, attribute: str) -> Any:
    """owner.attribute (dotted)."""
    for part in attribute.split("."):
        owner = getattr(owner, part)
    return owner


def _install_sites(sites: tuple[tuple[str, str, str], ...], number: int) -> None:
    """Wrap every (module, Class.attribute or function, file:line) of `sites` with _on_cpu_device (idempotent); a
    site this release lacks is skipped and recorded under shim `number`."""
    for module_name, attribute, where in sites:
        owner: Any = optional_module(module_name)
        if owner is not None and has_attr(owner, attribute) and not site_present(owner, attribute):
            if _ON_CPU in shims_on(_resolve(owner, attribute)):
                continue  # a re-export of a target another site wraps: the site moved, it did not vanish
        if owner is None or not site_present(owner, attribute):
            skip(number, f"{module_name}.{attribute} ({where}) is absent in this release")
            continue
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        _patch(owner, name, _on_cpu_device)


# --- Shim 2 -----------------------------------------------------------------------------------------
# megatron-bridge 0.6.2, megatron/bridge/models/conversion/param_mapping.py:1297:
# ReplicatedMapping.hf_to_megatron compares the target device with torch.cuda.current_device() whenever
# tp_size > 1 (norms, routers, biases), which raises without a CUDA driver. For a CPU target we run the same
# steps (rank > 0 gets an empty tensor, then the TP broadcast from rank 0) without the CUDA move; for any
# other target the original method runs unchanged.
def install_cpu_replicated_mapping() -> None:
    """Install shim 2 (idempotent)."""

    def cpu_replicated(original: Any) -> Any:
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            if not active() or self.tp_size == 1:
                return original(self, hf_weights, megatron_module)
            if hasattr(megatron_module, "weight"):
                target_device = megatron_module.weight.device
            else:
                target_device = next(megatron_module.parameters()).device
            if target_device.type != "cpu":
                return original(self, hf_weights, megatron_module)
            hf_weights = hf_weights.to(device=target_device)
            if self.tp_rank > 0:
                hf_weights = torch.empty_like(hf_weights)
            return self.broadcast_tensor_to_tp_ranks(hf_weights, src_rank=0)

        return hf_to_megatron

    _patch(param_mapping.ReplicatedMapping, "hf_to_megatron", cpu_replicated)


# --- Shim 3 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/models/common/language_module/language_module.py:307:
# setup_embeddings_and_output_layer moves the tied embedding/output weight to CUDA (`weight.data.cuda()`)
# before all-reducing it over the embedding group whenever PP > 1 and embeddings are tied. On a CPU run we run
# that method with Tensor.cuda as the identity, so the all-reduce runs on gloo over the CPU tensor; the values
# it produces are init values that the HF import overwrites either way.
def install_cpu_tied_embedding_setup() -> None:
    """Install shim 3 (idempotent)."""

    def cuda_as_identity(original: Any) -> Any:
        def setup_embeddings_and_output_layer(self):  # type: ignore[no-untyped-def]
            if not active():
                return original(self)
            saved = torch.Tensor.cuda
            torch.Tensor.cuda = lambda tensor, *args, **kwargs: tensor  # type: ignore[method-assign]
            try:
                return original(self)
            finally:
                torch.Tensor.cuda = saved  # type: ignore[method-assign]

        return setup_embeddings_and_output_layer

    _patch(LanguageModule, "setup_embeddings_and_output_layer", cuda_as_identity)


# --- Shim 4 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2 moves or allocates forward-pass tensors on torch.cuda.current_device() at the sites in
# CPU_DEVICE_SITES (module, attribute, file:line under megatron/core/): the RoPE frequencies, the attention
# matmul buffer, the router weight and the TP/EP gather/scatter outputs. On a CPU run each listed function runs
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


def install_cpu_device_sites() -> None:
    """Install shim 4 at every site of CPU_DEVICE_SITES (idempotent)."""
    _install_sites(CPU_DEVICE_SITES, 4)


# --- Shim 5 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/transformer/utils.py:39: get_default_causal_mask builds its mask with
# device="cuda"; the unfused softmax (fusions/fused_softmax.py:327, imported there by name) calls it when
# attention_mask is None. On a CPU run the same formula runs on the CPU: triu(ones(sq, sq), diagonal=1).bool().
def install_cpu_causal_mask() -> None:
    """Install shim 5 (idempotent) in both modules that bind the name."""

    def cpu_mask(original: Any) -> Any:
        def get_default_causal_mask(sq: int) -> torch.Tensor:
            if not active():
                return original(sq)
            return torch.triu(torch.ones(sq, sq, device="cpu"), diagonal=1).bool()

        return get_default_causal_mask

    wrapper = _patch(utils, "get_default_causal_mask", cpu_mask)
    if fused_softmax.get_default_causal_mask is wrapper._convcheck_original:
        fused_softmax.get_default_causal_mask = wrapper


# --- Shim 22 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/transformer/utils.py:42-49: get_sliding_window_causal_mask builds its [sq, skv]
# mask with device="cuda"; the unfused softmax (fusions/fused_softmax.py:322, imported there by name) calls it for
# every sliding-window layer (Mistral, GPT-OSS). On a CPU run the same formula runs on the CPU: keep key j of query i
# iff skv - sq - left <= j - i <= skv - sq + right, the mask being True where a score is dropped.
def install_cpu_sliding_window_mask() -> None:
    """Install shim 22 (idempotent) in both modules that bind the name; skipped where this release lacks it."""
    if not has_attr(utils, "get_sliding_window_causal_mask"):
        skip(22, "transformer/utils.py has no get_sliding_window_causal_mask in this release")
        return

    def cpu_window_mask(original: Any) -> Any:
        def get_sliding_window_causal_mask(sq: int, skv: int, window_size: Any) -> torch.Tensor:
            if not active():
                return original(sq, skv, window_size)
            keep = torch.ones(sq, skv, dtype=torch.bool, device="cpu")
            keep = torch.triu(keep, diagonal=skv - sq - window_size[0])
            return ~torch.tril(keep, diagonal=skv - sq + window_size[1])

        return get_sliding_window_causal_mask

    wrapper = _patch(utils, "get_sliding_window_causal_mask", cpu_window_mask)
    if getattr(fused_softmax, "get_sliding_window_causal_mask", None) is wrapper._convcheck_original:
        fused_softmax.get_sliding_window_causal_mask = wrapper


# --- Shim 6 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/transformer/dot_product_attention.py:217: attention dropout runs inside
# tensor_parallel.get_cuda_rng_tracker().fork(), which reads and writes the CUDA RNG state (and raises
# "cuda rng state model-parallel-rng is not added" when no CUDA seed was set). A CPU tensor's dropout draws
# from the CPU generator, never from CUDA state, so on a CPU run the fork is a no-op context. The Mamba mixer's
# forks (ssm/mamba_mixer.py:318, :370) go through the same method.
def install_cpu_rng_fork() -> None:
    """Install shim 6 (idempotent)."""

    def no_cuda_fork(original: Any) -> Any:
        def fork(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if not active():
                return original(self, *args, **kwargs)
            return contextlib.nullcontext()

        return fork

    _patch(CudaRNGStatesTracker, "fork", no_cuda_fork)


# --- Shim 9 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2 constructors that allocate on torch.cuda.current_device() (CPU_CONSTRUCTOR_SITES):
# - transformer/moe/router.py:178-194: TopKRouter.__init__ creates the `local_tokens_per_expert` and `expert_bias`
#   buffers there when moe_router_enable_expert_bias is set (NemotronH);
# - ssm/mamba_mixer.py:326-422: MambaMixer.__init__ creates conv1d, dt_bias, A_log, D and the gated norm there;
# - ssm/gated_delta_net/common.py:230-314: GatedDeltaNet.__init__ (its _GDNBase) creates conv1d, dt_bias and A_log
#   there and fills them in reset_parameters; megatron-core 0.17-0.18 do the same in GatedDeltaNet.__init__ of the
#   one module ssm/gated_delta_net.py (0.18: :179-259; 0.17: :173-249), a package re-exporting gdn.GatedDeltaNet
#   from 0.19 on (that site is then absent: site_present).
# On a CPU run each constructor runs with torch.cuda.current_device() answering "cpu" (shim 4's wrapper).
CPU_CONSTRUCTOR_SITES = (
    ("megatron.core.transformer.moe.router", "TopKRouter.__init__", "transformer/moe/router.py:184"),
    ("megatron.core.ssm.mamba_mixer", "MambaMixer.__init__", "ssm/mamba_mixer.py:326"),
    ("megatron.core.ssm.gated_delta_net.common", "_GDNBase.__init__", "ssm/gated_delta_net/common.py:230"),
    ("megatron.core.ssm.gated_delta_net", "GatedDeltaNet.__init__", "ssm/gated_delta_net.py:179"),  # 0.17-0.18
)
OLDER_CORE_ONLY = ("ssm/gated_delta_net.py:179",)
"""Sites of CPU_CONSTRUCTOR_SITES only megatron-core 0.17-0.18 have: no file:line of the current pins (the shims
table's targets leave them out; test_shim9_sites_still_allocate_on_cuda checks them where they exist)."""


def install_cpu_constructor_sites() -> None:
    """Install shim 9 at every site of CPU_CONSTRUCTOR_SITES (idempotent)."""
    _install_sites(CPU_CONSTRUCTOR_SITES, 9)


# --- Shim 11 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/dist_checkpointing/strategies/filesystem_async.py:248:
# FileSystemWriterAsync.preload_tensors stages the tensors of a torch_dist save with non_blocking=True copies and
# then calls torch.cuda.synchronize(), which raises without a CUDA driver. A CPU tensor's `.to("cpu")` is the tensor
# itself, so on a CPU run the same method runs with non_blocking=False: the same staging, no CUDA call.
def install_cpu_checkpoint_preload() -> None:
    """Install shim 11 (idempotent); skipped where this release has no FileSystemWriterAsync.preload_tensors."""
    module = optional_module("megatron.core.dist_checkpointing.strategies.filesystem_async")
    if module is None or not has_attr(module, "FileSystemWriterAsync.preload_tensors"):
        skip(11, "dist_checkpointing FileSystemWriterAsync.preload_tensors is absent in this release")
        return
    FileSystemWriterAsync = module.FileSystemWriterAsync  # noqa: N806

    def blocking_on_cpu(original: Any) -> Any:
        function = original.__func__ if isinstance(original, staticmethod) else original

        def preload_tensors(write_buckets, non_blocking=True):  # type: ignore[no-untyped-def]
            return function(write_buckets, non_blocking and not active())

        return staticmethod(preload_tensors)

    _patch(FileSystemWriterAsync, "preload_tensors", blocking_on_cpu)


# --- Shim 12 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/dist_checkpointing/strategies/state_dict_saver.py:252:
# save_state_dict_async_finalize broadcasts its failure flag in a tensor made on torch.cuda.current_device(). On a
# CPU run it runs with torch.cuda.current_device() answering "cpu" (shim 4's wrapper): the flag goes over gloo.
CPU_CHECKPOINT_SITES = (
    (
        "megatron.core.dist_checkpointing.strategies.state_dict_saver",
        "save_state_dict_async_finalize",
        "dist_checkpointing/strategies/state_dict_saver.py:252",
    ),
)


def install_cpu_checkpoint_finalize() -> None:
    """Install shim 12 at every site of CPU_CHECKPOINT_SITES (idempotent)."""
    _install_sites(CPU_CHECKPOINT_SITES, 12)


# --- Shim 18 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2 models/common/embeddings/yarn_rotary_pos_embedding.py: YarnRotaryEmbedding.__init__ allocates
# its frequencies on torch.cuda.current_device() (:76; MLA builds it without use_cpu_initialization,
# multi_latent_attention.py:190) and get_emb moves them there on the first forward (:122, :126). On a CPU run both
# run with torch.cuda.current_device() answering "cpu" (shim 4's wrapper).
YARN_SITES = (
    ("megatron.core.models.common.embeddings.yarn_rotary_pos_embedding", "YarnRotaryEmbedding.__init__",
     "models/common/embeddings/yarn_rotary_pos_embedding.py:76"),
    ("megatron.core.models.common.embeddings.yarn_rotary_pos_embedding", "YarnRotaryEmbedding.get_emb",
     "models/common/embeddings/yarn_rotary_pos_embedding.py:122"),
)  # fmt: skip


def install_cpu_yarn_rope() -> None:
    """Install shim 18 at every site of YARN_SITES (idempotent; active on CPU runs only)."""
    _install_sites(YARN_SITES, 18)


# --- Shim 23 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2 transformer/dot_product_attention.py:119-138: DotProductAttention.__init__ allocates the
# attention sinks (softmax_type "learnable": the softmax_offset parameter, one per local head; "off-by-one": a zero
# buffer) on torch.cuda.current_device() (:123, :132). On a CPU run the constructor runs with
# torch.cuda.current_device() answering "cpu" (shim 4's wrapper): the same tensors, on the CPU.
SINK_SITES = (
    ("megatron.core.transformer.dot_product_attention", "DotProductAttention.__init__",
     "transformer/dot_product_attention.py:132"),
)  # fmt: skip


def install_cpu_attention_sinks() -> None:
    """Install shim 23 at every site of SINK_SITES (idempotent; active on CPU runs only)."""
    _install_sites(SINK_SITES, 23)


# --- Shim 27 ----------------------------------------------------------------------------------------
# The multimodal RoPE of the Qwen-VL language models allocates its inverse frequencies on torch.cuda.current_device()
# in its constructor: megatron-core 0.19.2 models/common/embeddings/rotary_pos_embedding.py:305
# (MultimodalRotaryEmbedding, Qwen2.5-VL) and megatron-bridge 0.6.2 models/qwen_vl/modelling_qwen3_vl/rope.py:134
# (Qwen3VLMultimodalRotaryEmbedding, Qwen3-VL and Qwen3-VL-MoE); each forward then moves the positions to that
# tensor's device. The Qwen3-VL vision tower's 2-D RoPE does the same in its first forward (megatron-bridge 0.6.2
# models/qwen_vl/modelling_qwen3_vl/utils.py:90, Qwen3VLVisionRotaryEmbedding.forward), run by an image input only.
# On a CPU run these run with torch.cuda.current_device() answering "cpu" (shim 4's wrapper): the same frequencies,
# on the CPU.
MROPE_SITES = (
    ("megatron.core.models.common.embeddings.rotary_pos_embedding", "MultimodalRotaryEmbedding.__init__",
     "megatron/core/models/common/embeddings/rotary_pos_embedding.py:305"),
    ("megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope", "Qwen3VLMultimodalRotaryEmbedding.__init__",
     "megatron/bridge/models/qwen_vl/modelling_qwen3_vl/rope.py:134"),
    ("megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils", "Qwen3VLVisionRotaryEmbedding.forward",
     "megatron/bridge/models/qwen_vl/modelling_qwen3_vl/utils.py:90"),
)  # fmt: skip


def install_cpu_mrope() -> None:
    """Install shim 27 at every site of MROPE_SITES (idempotent; active on CPU runs only)."""
    _install_sites(MROPE_SITES, 27)


# --- Shim 28 ----------------------------------------------------------------------------------------
# megatron-bridge 0.6.2 models/minimax_m2/minimax_m2_bridge.py:63: _FullDimQKNormMapping.hf_to_megatron (MiniMax-M2's
# full-width q/k norms) moves the HF weight to torch.device("cuda", torch.cuda.current_device()) whenever tp_size > 1,
# before broadcasting it over TP and slicing this rank's part. For a CPU target the same steps (the target's dtype,
# an empty tensor on TP rank > 0, the TP broadcast from rank 0, this rank's slice) run on the CPU; for any other
# target the original method runs unchanged. The shard is the release's own: `_get_shard_spec` where the mapping
# base has it (0.5.x, 0.6.x), else the TP rank (0.4.x).
FULL_DIM_QK_NORM = ("megatron.bridge.models.minimax_m2.minimax_m2_bridge", "_FullDimQKNormMapping",
                    "megatron/bridge/models/minimax_m2/minimax_m2_bridge.py:63")  # fmt: skip


def install_cpu_full_dim_qk_norm_mapping() -> None:
    """Install shim 28 (idempotent; skipped where the bridge has no MiniMax-M2 full-width q/k norm mapping)."""
    module_name, class_name, where = FULL_DIM_QK_NORM
    module = optional_module(module_name)
    if module is None or not has_attr(module, class_name + ".hf_to_megatron"):
        skip(28, f"{module_name}.{class_name} ({where}) is absent in this release")
        return

    def cpu_full_dim(original: Any) -> Any:
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            target = megatron_module.weight
            if not active() or self.tp_size == 1 or target.device.type != "cpu":
                return original(self, hf_weights, megatron_module)
            shard_size = target.shape[0]
            if hasattr(self, "_get_shard_spec"):  # 0.5.x, 0.6.x: replicated shards counted once
                _, shard_rank = self._get_shard_spec(
                    shard_size=shard_size, megatron_module=megatron_module, global_size_attr="global_dim"
                )
            else:  # 0.4.x slices at the TP rank (minimax_m2_bridge.py:76 in 0.4.2)
                shard_rank = self.tp_rank
            hf_weights = hf_weights.to(device=target.device, dtype=target.dtype)
            if self.tp_rank > 0:
                hf_weights = torch.empty_like(hf_weights)
            full = self.broadcast_tensor_to_tp_ranks(hf_weights, src_rank=0)
            return full[shard_rank * shard_size : (shard_rank + 1) * shard_size]

        return hf_to_megatron

    _patch(getattr(module, class_name), "hf_to_megatron", cpu_full_dim)


# --- Shim 29 ----------------------------------------------------------------------------------------
# Constructors of the Gemma 3 VL / Gemma 4 bridges that allocate on torch.cuda.current_device() because they build a
# megatron-core module without use_cpu_initialization:
# - megatron-bridge 0.6.2 models/gemma/modeling_gemma4.py:826-855: Gemma4DenseRotaryEmbedding.__init__ (the provider
#   builds it from the config alone, gemma4_provider.py:248) builds RotaryEmbedding (megatron-core
#   models/common/embeddings/rotary_pos_embedding.py:78) and _Gemma4ProportionalRotaryEmbedding (:804) with
#   use_cpu_initialization False (the MoE provider's Gemma4RotaryEmbedding gets the provider's setting, :361);
# - megatron-bridge 0.6.2 models/gemma_vl/modeling_gemma3_vl.py:316: Gemma3VLMultimodalProjector.__init__ builds a
#   ColumnParallelLinear from the vision projection config, whose weight megatron-core allocates on CUDA
#   (tensor_parallel/layers.py:1000).
# On a CPU run each constructor runs with torch.cuda.current_device() answering "cpu" (shim 4's wrapper): the same
# frequencies and weights, on the CPU.
GEMMA_CONSTRUCTOR_SITES = (
    ("megatron.bridge.models.gemma.modeling_gemma4", "Gemma4DenseRotaryEmbedding.__init__",
     "megatron/bridge/models/gemma/modeling_gemma4.py:804"),
    ("megatron.bridge.models.gemma_vl.modeling_gemma3_vl", "Gemma3VLMultimodalProjector.__init__",
     "megatron/bridge/models/gemma_vl/modeling_gemma3_vl.py:316"),
)  # fmt: skip


def install_cpu_gemma_constructors() -> None:
    """Install shim 29 at every site of GEMMA_CONSTRUCTOR_SITES (idempotent; active on CPU runs only)."""
    _install_sites(GEMMA_CONSTRUCTOR_SITES, 29)


def install() -> None:
    """Install shims 2-6, 9, 11, 12, 18, 22, 23, 27, 28 and 29 (idempotent) and route them to the CPU."""
    install_cpu_replicated_mapping()
    install_cpu_tied_embedding_setup()
    install_cpu_device_sites()
    install_cpu_causal_mask()
    install_cpu_sliding_window_mask()
    install_cpu_rng_fork()
    install_cpu_constructor_sites()
    install_cpu_checkpoint_preload()
    install_cpu_checkpoint_finalize()
    install_cpu_yarn_rope()
    install_cpu_attention_sinks()
    install_cpu_mrope()
    install_cpu_full_dim_qk_norm_mapping()
    install_cpu_gemma_constructors()
    set_active(True)
