"""distckpt oracle: a torch_dist checkpoint saved at one layout resumes at another, bitwise; planted bugs are named.

Each layout pair costs a save launch and a resume launch; repeating --resume-layout resumes one save at several
layouts, so the pairs TP1<->TP2, EP1<->EP2, PP1<->PP2 and TP2xEP2 -> TP1 share launches.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from convcheck import compat
from tests.helpers import mutant, run_cli


def test_shim11_still_needed_checkpoint_preload_synchronizes_cuda() -> None:
    """Fails when the torch_dist save stops calling torch.cuda.synchronize() while staging (then delete shim 11)."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    method = compat.upstream(FileSystemWriterAsync.__dict__["preload_tensors"])
    assert "torch.cuda.synchronize()" in inspect.getsource(method.__func__)


def test_shim12_still_needed_checkpoint_finalize_flag_on_cuda() -> None:
    """Fails when the save's finalize stops making its failure flag on CUDA (then delete shim 12)."""
    from megatron.core.dist_checkpointing.strategies import state_dict_saver

    method = compat.upstream(state_dict_saver.save_state_dict_async_finalize)
    assert "device=torch.cuda.current_device()" in inspect.getsource(method)


def test_optimizer_part_still_cuda_only() -> None:
    """Fails when megatron-core's DDP / distributed optimizer no longer need CUDA (then run the optimizer part on CPU)."""
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.optimizer import distrib_optimizer, optimizer

    from convcheck.ckpt.optimizer import CPU_BLOCKERS

    assert "device=torch.cuda.current_device()" in inspect.getsource(param_and_grad_buffer._ParamAndGradBuffer)
    assert "device='cuda'" in inspect.getsource(optimizer.MixedPrecisionOptimizer.__init__)
    assert "'torch.cuda.BFloat16Tensor'" in inspect.getsource(distrib_optimizer.DistributedOptimizer)
    assert len(CPU_BLOCKERS) == 3
