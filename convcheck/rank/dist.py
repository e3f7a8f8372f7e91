"""Process-group setup for one rank launched by torchrun (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core import parallel_state as ps

from convcheck.layout import ParallelLayout
from convcheck.mappings.base import RankCoord


def init_distributed(layout: ParallelLayout, device: str, timeout_s: float) -> tuple[int, int]:
    """Initialise torch.distributed from torchrun's env and Megatron's parallel_state; return (rank, world)."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != layout.world_size:
        raise RuntimeError(f"launched with {world} ranks but layout {layout.label} needs {layout.world_size}")
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
    )
    if device == "cuda":  # Megatron's CUDA RNG tracker (used by attention dropout scopes in the forward)
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    return rank, world


def rank_coord() -> RankCoord:
    """This rank's place in the grid, read once from Megatron's parallel_state (the engine's job, not an oracle's)."""
    return RankCoord(
        tp_rank=ps.get_tensor_model_parallel_rank(),
        ep_rank=ps.get_expert_model_parallel_rank(),
        etp_rank=ps.get_expert_tensor_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
    )


def shutdown_distributed() -> None:
    """Tear down Megatron's groups and the default process group."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


AXES = ("tp", "pp", "ep", "etp", "dp", "world")
"""The axes `parallel_state_group` knows."""


def parallel_state_group(axis: str) -> Any:
    """megatron-core parallel_state's process group of this rank along `axis` (one of AXES; "world": the default)."""
    getters = {
        "tp": ps.get_tensor_model_parallel_group,
        "pp": ps.get_pipeline_model_parallel_group,
        "ep": ps.get_expert_model_parallel_group,
        "etp": ps.get_expert_tensor_parallel_group,
        "dp": ps.get_data_parallel_group,
        "world": lambda: dist.group.WORLD,
    }
    if axis not in getters:
        raise ValueError(f"unknown axis {axis!r}; known: {', '.join(AXES)}")
    return getters[axis]()
