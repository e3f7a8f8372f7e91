"""`--hook`s of tests/test_qwen3_vl.py: the fix of the Qwen3-VL merger GELU bug (qwen3-vl-merger-gelu-tanh)."""

from __future__ import annotations

from typing import Any


def merger_gelu_exact() -> None:
    """qwen3-vl-merger-gelu-tanh fixed: the (deepstack) patch mergers apply exact (erf) GELU, as HF's
    Qwen3VLVisionPatchMerger does (nn.GELU()), while the vision blocks keep the config's tanh approximation."""
    import torch
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import utils

    init = utils.Qwen3VLVisionPatchMerger.__init__

    def exact(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.activation_func = torch.nn.functional.gelu

    utils.Qwen3VLVisionPatchMerger.__init__ = exact
