"""Build, fill and load the Megatron model of one rank through the real AutoBridge and its provider."""

from __future__ import annotations

from typing import Any, Callable

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge import AutoBridge
from megatron.bridge.models.conversion.utils import persistent_buffers
from megatron.bridge.models.model_provider import ModelProviderMixin
from megatron.core.transformer.module import MegatronModule

from convcheck.compare.bits import count_true, int_view
from convcheck.errors import BadInput, first_line, one_line, raised_at
from convcheck.fixtures.readback import check_readback
from convcheck.layout import ParallelLayout
from convcheck.rank.te_grouped import apply_experts_option
from convcheck.versions import versions


def load_bridge(model_path: str) -> Any:
    """The real AutoBridge for a checkpoint; an unsupported architecture is bad input."""
    try:
        bridge = AutoBridge.from_hf_pretrained(model_path)
    except Exception as exc:  # the bridge wraps every failure in ValueError
        stack = ", ".join(f"{n} {v}" for n, v in versions().items() if n in ("megatron-bridge", "transformers"))
        raise BadInput(f"the bridge cannot load {model_path} ({stack}): {first_line(exc)}") from None
    config = getattr(bridge.hf_pretrained, "config", bridge.hf_pretrained)
    check_readback(model_path, config, versions().get("transformers", "?"))  # a fixture this transformers misreads
    return bridge


def make_provider(bridge: AutoBridge, layout: ParallelLayout, device: str, pad_vocab: int | None = None,
                  spec: str = "local") -> Any:  # fmt: skip
    """The bridge's provider for this checkpoint, set to `layout` (TE-free where TE is missing, or with `spec="te"`
    the bridge's TE specs on convcheck's stand-in; CPU-safe on CPU).

    `pad_vocab=N` builds the padded vocabulary training uses: rows rounded up to a multiple of N x TP."""
    from convcheck import compat  # lazy: imports torch (launcher side)

    provider = bridge.to_megatron_provider(load_weights=False)
    if pad_vocab is not None:
        provider.make_vocab_size_divisible_by = pad_vocab
        provider.should_pad_vocab = True
    provider.tensor_model_parallel_size = layout.tp
    provider.pipeline_model_parallel_size = layout.pp
    provider.virtual_pipeline_model_parallel_size = layout.vpp if layout.vpp > 1 else None
    provider.num_layers_in_first_pipeline_stage = layout.pp_first
    provider.num_layers_in_last_pipeline_stage = layout.pp_last
    provider.account_for_embedding_in_pipeline_split = layout.pp_embed
    provider.account_for_loss_in_pipeline_split = layout.pp_loss
    provider.expert_model_parallel_size = layout.ep
    provider.expert_tensor_parallel_size = layout.etp
    # off, except where megatron-core builds nothing without it: the DSA spec's AbsorbedMLA asserts sequence
    # parallelism at TP > 1 (experimental_attention_variant/absorbed_mla.py:170-172), as GLM-5 trains
    provider.sequence_parallel = layout.tp > 1 and getattr(provider, "experimental_attention_variant", None) == "dsa"
    compat.configure_provider(provider, device, spec)
    provider.finalize()
    return provider


def build_model(provider: ModelProviderMixin, device: str, experts: str = "auto", spec: str = "te") -> list[Any]:
    """Instantiate the model chunks for this rank (no DDP wrapper, no weight init work wasted).

    With `spec="te"` the experts are megatron-core's own modules on the TE stand-in: `experts="auto"` builds what the
    provider asks for (TEGroupedMLP where the bridge sets moe_grouped_gemm), "te-grouped" / "sequential" turn
    moe_grouped_gemm on / off. With the local spec, "te-grouped" lays the SequentialMLP experts out as TEGroupedMLP's
    parameters (the layout stand-in, convcheck.rank.te_grouped) and "auto" is "sequential".
    """
    provider.perform_initialization = False
    if spec == "te" and experts != "auto":
        provider.moe_grouped_gemm = experts == "te-grouped"
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=(device == "cpu"))
    if spec != "te":
        apply_experts_option(model, "sequential" if experts == "auto" else experts)
    return model


def named_tensors(model: list[MegatronModule]) -> list[tuple[int, str, Any]]:
    """(vp_stage, local name, tensor) for every parameter and persistent buffer (the chunk's `named_parameters()`,
    then the bridge's `persistent_buffers`), wrappers stripped."""
    out = []
    for vp_stage, chunk in enumerate(model):
        for name, tensor in parameters_and_buffers(chunk):
            if "_extra_state" in name:
                continue
            while name.startswith("module."):
                name = name[len("module.") :]
            out.append((vp_stage, name, tensor))
    return out


def parameters_and_buffers(chunk: Any) -> list[tuple[str, Any]]:
    """`list(chunk.named_parameters()) + list(persistent_buffers(chunk))`, in one pass over the modules where every
    module walks the way torch.nn.Module does (the two walks are the same pre-order; a real model has thousands of
    modules); else those two calls."""
    params: list[tuple[str, Any]] = []
    buffers: list[tuple[str, Any]] = []
    if _walk(chunk, "", set(), set(), params, buffers, {}):
        return params + buffers

    return list(chunk.named_parameters()) + list(persistent_buffers(chunk))


def _walk(
    module: Any,
    prefix: str,
    modules: set[Any],
    seen: set[Any],
    params: list[Any],
    buffers: list[Any],
    own: dict[type, bool],
) -> bool:
    """Module.named_modules' pre-order from `module`: its parameters not met before (named_parameters' one memo for
    the whole walk) and its persistent buffers (persistent_buffers: each module's own, repeats within it dropped);
    False as soon as a module's class walks its own way (`own`: that answer per class, for this walk)."""
    if not _torch_walk(type(module), own):
        return False
    modules.add(module)
    dot = prefix + "." if prefix else ""
    for key, value in module._parameters.items():
        if value is not None and value not in seen:
            seen.add(value)
            params.append((dot + key, value))
    if module._buffers:
        skip = getattr(module, "_non_persistent_buffers_set", ())
        met: set[Any] = set()
        for key, value in module._buffers.items():
            if value is None or value in met:
                continue
            met.add(value)
            if key not in skip:
                buffers.append((dot + key, value))
    for key, child in module._modules.items():
        if child is not None and child not in modules:
            if not _walk(child, dot + key, modules, seen, params, buffers, own):
                return False
    return True


_WALKS = ("named_modules", "named_parameters", "named_buffers", "_named_members")


def _torch_walk(cls: type, known: dict[type, bool]) -> bool:
    """True when `cls` keeps torch.nn.Module's own walking methods (answered once per class per walk in `known`)."""
    found = known.get(cls)
    if found is None:
        base = torch.nn.Module
        found = known[cls] = all(getattr(cls, n, None) is getattr(base, n) for n in _WALKS)
    return found


SENTINEL_BITS = {"bfloat16": 0x7FA5, "float16": 0x7CA5, "float32": 0x7FA5A5A5, "float64": 0x7FF4A5A5A5A5A5A5}
"""The pre-load fill of each float dtype, as raw bits: a NaN with a payload no arithmetic produces (torch's own NaN
is 0x7FC0 in bf16), so a checkpoint's NaN weights are not mistaken for elements the import never wrote."""


def sentinel_bits(dtype: Any) -> int:
    """The sentinel's bits for a float dtype (a dtype without a listed payload gets its own default NaN)."""
    name = str(dtype).removeprefix("torch.")
    if name in SENTINEL_BITS:
        return SENTINEL_BITS[name]

    return int(int_view(torch.full((1,), float("nan"), dtype=dtype))[0])


def _bits_view(tensor: Any) -> Any:
    """The tensor's storage seen as integers of the same width (any strides; writes go through)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return tensor.detach().view(ints[tensor.element_size()])


def fill_sentinel(model: list[MegatronModule]) -> None:
    """Set every floating parameter and persistent buffer to the sentinel NaN, so anything the import skips shows."""
    with torch.no_grad():
        for _, _, tensor in named_tensors(model):
            if tensor.is_floating_point():
                _bits_view(tensor).fill_(sentinel_bits(tensor.dtype))


def sentinel_count(tensor: Any) -> int:
    """How many elements of a float tensor hold exactly the sentinel's bits (other NaNs do not count)."""
    return count_true(_bits_view(tensor) == sentinel_bits(tensor.dtype))


def unloaded_counts(global_name: Callable[[str, int], str], model: list[MegatronModule]) -> dict[str, int]:
    """Global name -> count of elements that still hold the sentinel bits after the import."""
    out = {}
    for vp_stage, local, tensor in named_tensors(model):
        if tensor.is_floating_point():
            count = sentinel_count(tensor)
            if count:
                out[global_name(local, vp_stage)] = count
    return out


def load_weights(bridge: AutoBridge, model: list[MegatronModule]) -> tuple[str, str] | None:
    """Fill the model with the sentinel, then run the bridge's import; (one line, where it was raised) when it
    raised, else None."""
    fill_sentinel(model)
    try:
        bridge.load_hf_weights(model)
    except Exception as exc:  # noqa: BLE001 - reported by the oracles as a finding
        return one_line(exc), raised_at(exc)
    return None
