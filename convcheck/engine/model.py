"""Build the Megatron model for one rank through the real AutoBridge provider."""

from __future__ import annotations

from typing import Any

from convcheck.layout import ParallelLayout


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

    `experts="te-grouped"` lays MoE experts out as TEGroupedMLP (convcheck.engine.te_grouped).
    """
    from convcheck.engine.te_grouped import apply_experts_option

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
