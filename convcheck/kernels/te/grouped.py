"""megatron-core's `TEGroupedLinear`, `TEColumnParallelGroupedLinear` and `TERowParallelGroupedLinear`
(megatron/core/extensions/transformer_engine.py:2106, :2612, :2664) over the parameters TE 2.20.2's `GroupedLinear`
registers (pytorch/module/grouped_linear.py:1620): one GEMM per local expert, so megatron-core's own TEGroupedMLP
(transformer/moe/experts.py:182) builds and runs on them unmodified.

Parameters: `weight{i}` [out_features, in_features] and, with biases, `bias{i}` [out_features] for i in
[0, num_local_experts), in config.params_dtype; fc1 (column) out_features = output_size / expert-TP, fc2 (row)
in_features = input_size / expert-TP, with TE's own parallel mode off under explicit expert communication, as
megatron-core builds them; attributes from megatron-core's `_set_expert_parameter_attributes` (row-parallel biases
whole on every expert-TP rank). TE's single grouped weight (`weight` [E, out, in], opt-in through
NVTE_GROUPED_LINEAR_SINGLE_PARAM) is not stood in for.

Forward(x, m_splits): the rows of x split by m_splits, row block i times `weight{i}`^T (+ `bias{i}` unless returned),
concatenated; no TP communication (the expert token dispatcher does it); with skip_bias_add the per-expert biases
are returned as a list, as TE does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.utils import get_pg_size

from convcheck.kernels.te.checkpoint import grouped_sharded
from convcheck.kernels.te.core_compat import mark_expert_parameters
from convcheck.kernels.te.linear import _refuse_unsupported, _tp
from convcheck.kernels.te.norm import te_device
from convcheck.kernels.te.rules import ParamRule, TeSource


class TEGroupedLinear(torch.nn.Module):
    """One linear per local expert (`weight{i}`, `bias{i}`), forward on the rows m_splits assigns to each."""

    TE_SOURCE = TeSource("transformer_engine/pytorch/module/grouped_linear.py", "GroupedLinear")
    TE_PARAMETERS = (
        ParamRule("weight{i}", ("out_features", "in_features"), "params_dtype"),
        ParamRule("bias{i}", ("out_features",), "params_dtype"),
    )

    def __init__(self, num_gemms: int, input_size: int, output_size: int, *, parallel_mode: str | None,
                 config: Any, init_method: Callable, bias: bool, skip_bias_add: bool, is_expert: bool = False,
                 tp_comm_buffer_name: str | None = None, pg_collection: Any = None,
                 name: str | None = None) -> None:  # fmt: skip

        super().__init__()
        assert is_expert, "TEGroupedLinear only supports expert parallelism"
        _refuse_unsupported(config)
        if getattr(config, "moe_single_grouped_weight", False) or getattr(config, "moe_single_grouped_bias", False):
            raise NotImplementedError("convcheck's Transformer Engine stand-in has no single grouped weight")
        self.config = config
        self.te_return_bias = skip_bias_add and bias
        self.is_first_microbatch = True
        self.expert_parallel = config.expert_model_parallel_size > 1
        use_expert_pgs = self.expert_parallel or config.expert_tensor_parallel_size != config.tensor_model_parallel_size
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        self._pg_collection = pg_collection
        self._tp_group = pg_collection.expt_tp
        tp_size = get_pg_size(self._tp_group)
        self.explicit_expert_comm = tp_size > 1 or self.expert_parallel
        te_mode = parallel_mode
        if self.explicit_expert_comm:
            if parallel_mode == "column":
                output_size //= tp_size
            elif parallel_mode == "row":
                input_size //= tp_size
            te_mode, tp_size = None, 1
        # TE GroupedLinear.__init__
        self.num_gemms = num_gemms
        self.parallel_mode = te_mode
        self.tp_size = tp_size
        if te_mode == "column":
            output_size //= tp_size
        elif te_mode == "row":
            input_size //= tp_size
        self.in_features, self.out_features = input_size, output_size
        self.use_bias, self.return_bias = bias, self.te_return_bias
        self.apply_bias = bias and not self.te_return_bias
        self.params_dtype = config.params_dtype
        device = te_device(config)
        for i in range(num_gemms):
            weight = torch.empty(output_size, input_size, dtype=self.params_dtype, device=device)
            self.register_parameter(f"weight{i}", torch.nn.Parameter(weight))
            if bias:
                self.register_parameter(f"bias{i}", torch.nn.Parameter(torch.zeros(output_size, dtype=self.params_dtype,
                                                                                   device=device)))  # fmt: skip
            else:
                setattr(self, f"bias{i}", torch.Tensor().to(dtype=self.params_dtype, device=device))
            if config.perform_initialization:
                with torch.no_grad():
                    init_method(getattr(self, f"weight{i}"))
            _tp(getattr(self, f"weight{i}"), 1 if te_mode == "row" else 0)
            if bias and te_mode == "column":
                _tp(getattr(self, f"bias{i}"), 0)
        mark_expert_parameters(self, parallel_mode, use_expert_pgs, self.expert_parallel)

    def forward(self, x: torch.Tensor, m_splits: Any) -> tuple[torch.Tensor, Any]:
        """[tokens, in] -> [tokens, out]: expert i's rows (m_splits[i] of them, in order) through `weight{i}`."""
        splits = [int(m) for m in (m_splits.tolist() if isinstance(m_splits, torch.Tensor) else m_splits)]
        if len(splits) != self.num_gemms:
            raise ValueError(f"Shape of splits ({len(splits)}) does not match number of GEMMs ({self.num_gemms}).")
        outs = []
        for i, rows in enumerate(torch.split(x, splits)):
            bias = getattr(self, f"bias{i}").to(x.dtype) if self.apply_bias else None
            outs.append(F.linear(rows, getattr(self, f"weight{i}").to(x.dtype), bias))
        out = torch.cat(outs) if outs else x.new_empty(0, self.out_features)
        self.is_first_microbatch = False
        if self.te_return_bias:
            return out, [getattr(self, f"bias{i}").to(x.dtype) for i in range(self.num_gemms)]
        return out, None

    def backward_dw(self) -> None:
        """Nothing deferred (delay_wgrad_compute is refused)."""


class TEColumnParallelGroupedLinear(TEGroupedLinear):
    """fc1 of TEGroupedMLP: `weight{i}` [output_size / expert-TP, input_size]."""

    def __init__(self, num_gemms: int, input_size: int, output_size: int, *, config: Any, init_method: Callable,
                 bias: bool, skip_bias_add: bool, is_expert: bool, tp_comm_buffer_name: str | None = None,
                 pg_collection: Any = None, name: str | None = None) -> None:  # fmt: skip
        super().__init__(num_gemms, input_size, output_size, parallel_mode="column", config=config,
                         init_method=init_method, bias=bias, skip_bias_add=skip_bias_add, is_expert=is_expert,
                         tp_comm_buffer_name=tp_comm_buffer_name, pg_collection=pg_collection, name=name)  # fmt: skip

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
        """Per expert: split along dim 0 over expert TP, bias too."""
        return grouped_sharded(self, {"weight": 0, "bias": 0}, prefix, sharded_offsets, metadata)


class TERowParallelGroupedLinear(TEGroupedLinear):
    """fc2 of TEGroupedMLP: `weight{i}` [output_size, input_size / expert-TP], `bias{i}` [output_size] whole."""

    def __init__(self, num_gemms: int, input_size: int, output_size: int, *, config: Any, init_method: Callable,
                 bias: bool, skip_bias_add: bool, is_expert: bool, tp_comm_buffer_name: str | None = None,
                 pg_collection: Any = None, name: str | None = None) -> None:  # fmt: skip
        super().__init__(num_gemms, input_size, output_size, parallel_mode="row", config=config,
                         init_method=init_method, bias=bias, skip_bias_add=skip_bias_add, is_expert=is_expert,
                         tp_comm_buffer_name=tp_comm_buffer_name, pg_collection=pg_collection, name=name)  # fmt: skip

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
        """Per expert: split along dim 1 over expert TP, bias whole."""
        return grouped_sharded(self, {"weight": 1}, prefix, sharded_offsets, metadata)
