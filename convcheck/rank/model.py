"""Build, fill and load the Megatron model of one rank through the real AutoBridge and its provider."""

from __future__ import annotations

from typing import Any, Callable

from convcheck.errors import BadInput, first_line, one_line
from convcheck.layout import ParallelLayout


def load_bridge(model_path: str) -> Any:
    """The real AutoBridge for a checkpoint; an unsupported architecture is bad input."""
    from megatron.bridge import AutoBridge

    try:
        return AutoBridge.from_hf_pretrained(model_path)
    except Exception as exc:  # the bridge wraps every failure in ValueError
        from convcheck.versions import versions

        stack = ", ".join(f"{n} {v}" for n, v in versions().items() if n in ("megatron-bridge", "transformers"))
        raise BadInput(f"the bridge cannot load {model_path} ({stack}): {first_line(exc)}") from None


def make_provider(bridge: Any, layout: ParallelLayout, device: str) -> Any:
    """The bridge's provider for this checkpoint, set to `layout` (TE-free where TE is missing, CPU-safe on CPU)."""
    from convcheck import compat

    provider = bridge.to_megatron_provider(load_weights=False)
    provider.tensor_model_parallel_size = layout.tp
    provider.pipeline_model_parallel_size = layout.pp
    provider.expert_model_parallel_size = layout.ep
    provider.expert_tensor_parallel_size = layout.etp
    provider.sequence_parallel = False
    compat.configure_provider(provider, device)
    provider.finalize()
    return provider


def build_model(provider: Any, device: str, experts: str = "sequential") -> list[Any]:
    """Instantiate the model chunks for this rank (no DDP wrapper, no weight init work wasted).

    `experts="te-grouped"` lays MoE experts out as TEGroupedMLP (convcheck.rank.te_grouped).
    """
    from convcheck.rank.te_grouped import apply_experts_option

    provider.perform_initialization = False
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=(device == "cpu"))
    apply_experts_option(model, experts)
    return model


def named_tensors(model: list[Any]) -> list[tuple[int, str, Any]]:
    """(vp_stage, local name, tensor) for every parameter and persistent buffer, wrappers stripped."""
    from megatron.bridge.models.conversion.utils import persistent_buffers

    out = []
    for vp_stage, chunk in enumerate(model):
        for name, tensor in list(chunk.named_parameters()) + list(persistent_buffers(chunk)):
            if "_extra_state" in name:
                continue
            while name.startswith("module."):
                name = name[len("module.") :]
            out.append((vp_stage, name, tensor))
    return out


def fill_sentinel(model: list[Any]) -> None:
    """Set every floating parameter and persistent buffer to NaN, so anything the import skips shows."""
    import torch

    with torch.no_grad():
        for _, _, tensor in named_tensors(model):
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))


def unloaded_counts(global_name: Callable[[str, int], str], model: list[Any]) -> dict[str, int]:
    """Global name -> count of elements that still hold the NaN sentinel after the import."""
    out = {}
    for vp_stage, local, tensor in named_tensors(model):
        if tensor.is_floating_point():
            count = int(tensor.isnan().sum())
            if count:
                out[global_name(local, vp_stage)] = count
    return out


def load_weights(bridge: Any, model: list[Any]) -> str | None:
    """Fill the model with the sentinel, then run the bridge's import; one line when it raised, else None."""
    fill_sentinel(model)
    try:
        bridge.load_hf_weights(model)
    except Exception as exc:  # noqa: BLE001 - reported by the oracles as a finding
        return one_line(exc)
    return None
