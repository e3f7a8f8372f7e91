"""megatron-core's Transformer Engine linears in torch: `TELinear`, `TEColumnParallelLinear`, `TERowParallelLinear`
and `TELayerNormColumnParallelLinear` (megatron/core/extensions/transformer_engine.py:855, :1381, :1643, :1122), over
the parameters TE 2.20.2's `Linear` / `LayerNormLinear` register (pytorch/module/linear.py:2002,
layernorm_linear.py:1306).

Parameters (TE's names, order and shapes; dtype config.params_dtype):
- `weight` [out_features, in_features]: column-parallel out_features = output_size / tp, row-parallel
  in_features = input_size / tp; experts under explicit expert communication (EP > 1 or expert TP > 1) divide the
  same way with TE's own parallel mode off, as megatron-core does;
- `bias` [out_features] when asked for (a row-parallel bias is whole on every rank), else an empty tensor attribute;
- LayerNormLinear first registers `layer_norm_weight` [in_features] (ones, zeros when zero-centered) and, for
  LayerNorm, `layer_norm_bias` [in_features]; both replicated over TP.

Attributes as TE and megatron-core set them: weights `tensor_model_parallel`, `partition_dim` (0 column, 1 row),
`partition_stride`; column biases the same along dim 0; `allreduce`, `sequence_parallel`; experts through
megatron-core's own `_set_expert_parameter_attributes`.

Forward: y = x W^T (+ b), the input copied into the TP region for a column-parallel layer, the output all-reduced
over TP before the bias for a row-parallel one, and megatron-core's `(output, bias)` return (the bias returned
unapplied with skip_bias_add). With sequence parallelism (TE's `sequence_parallel = tp_size > 1 and
config.sequence_parallel`, linear.py:2067, layernorm_linear.py:1383) the input [s / tp, b, h] of a column-parallel
layer is all-gathered along the sequence dim before the GEMM (linear.py:444; LayerNormLinear norms its shard first,
then gathers the normed input: layernorm_linear.py:174) and the output of a row-parallel one reduce-scattered along it
instead of all-reduced (linear.py:667), through megatron-core's own sequence-parallel mappings; the row-parallel
bias and the LayerNormLinear norm weights carry `sequence_parallel` (linear.py:2308, layernorm_linear.py:1653). FP8,
userbuffers overlap and delayed wgrad are not stood in for (they raise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)
from megatron.core.utils import get_pg_size, get_tensor_model_parallel_group_if_none

from convcheck.kernels.te.checkpoint import tp_sharded
from convcheck.kernels.te.core_compat import mark_expert_parameters
from convcheck.kernels.te.norm import layer_norm, rms_norm, te_device
from convcheck.kernels.te.rules import ParamRule, TeSource

_LINEAR_PARAMETERS = (
    ParamRule("weight", ("out_features", "in_features"), "params_dtype"),
    ParamRule("bias", ("out_features",), "params_dtype"),
)


def _refuse_unsupported(config: Any) -> None:
    """Raise for the settings the stand-in does not compute (it would compute something else silently)."""
    for flag in ("fp8", "fp4", "delay_wgrad_compute", "tp_comm_overlap"):
        if getattr(config, flag, None):
            raise NotImplementedError(f"convcheck's Transformer Engine stand-in does not support {flag}")


def _tp(tensor: torch.Tensor, dim: int, stride: int = 1) -> None:
    """TE's set_tensor_model_parallel_attributes (pytorch/distributed.py:150)."""
    tensor.tensor_model_parallel, tensor.partition_dim, tensor.partition_stride = True, dim, stride


class TELinear(torch.nn.Module):
    """megatron-core's TELinear: TE Linear with parallel_mode column, row or duplicated; forward -> (out, bias)."""

    TE_SOURCE = TeSource("transformer_engine/pytorch/module/linear.py", "Linear")
    TE_PARAMETERS = _LINEAR_PARAMETERS

    def __init__(self, input_size: int, output_size: int, *, parallel_mode: str | None, config: Any,
                 init_method: Callable, bias: bool, skip_bias_add: bool, skip_weight_param_allocation: bool,
                 tp_comm_buffer_name: str | None = None, is_expert: bool = False, symmetric_ar_type: str | None = None,
                 tp_group: Any = None, name: str | None = None, gtp_remat_group: Any = None) -> None:  # fmt: skip

        super().__init__()
        if skip_weight_param_allocation:
            raise ValueError("Transformer Engine linear layers do not support skip_weight_param_allocation")
        _refuse_unsupported(config)
        self.config = config
        self.te_return_bias = skip_bias_add and bias
        self.is_first_microbatch = True
        if parallel_mode == "duplicated":
            assert tp_group is None, "duplicated linear should not have tp_group set"
            tp_size = 1
        else:
            tp_size = get_pg_size(tp_group)
        self.expert_parallel = config.expert_model_parallel_size > 1
        use_expert_pgs = is_expert and (
            self.expert_parallel or config.expert_tensor_parallel_size != config.tensor_model_parallel_size
        )
        te_mode, te_group = parallel_mode, tp_group
        if parallel_mode == "duplicated":
            te_mode, te_group, tp_size = None, None, 1
        elif is_expert and (tp_size > 1 or self.expert_parallel):  # explicit expert communication
            if parallel_mode == "column":
                output_size //= tp_size
            elif parallel_mode == "row":
                input_size //= tp_size
            te_mode, te_group, tp_size = None, None, 1
        self._te_linear(input_size, output_size, te_mode, te_group, tp_size, bias, init_method)
        if is_expert:
            mark_expert_parameters(self, parallel_mode, use_expert_pgs, self.expert_parallel)
        else:
            for param in self.parameters():
                param.allreduce = True
                if parallel_mode == "duplicated":
                    param.sequence_parallel = config.sequence_parallel
                    param.tensor_model_parallel = False
        self._tp_group = get_tensor_model_parallel_group_if_none(tp_group, is_expert=is_expert)

    def _te_linear(self, in_features: int, out_features: int, parallel_mode: str | None, tp_group: Any, tp_size: int,
                   bias: bool, init_method: Callable) -> None:  # fmt: skip
        """TE Linear.__init__'s parameters and attributes (parameters_split None: one `weight`, one `bias`)."""
        self.parallel_mode = parallel_mode
        self.tp_size = tp_size
        self.tp_group = tp_group if torch.distributed.is_initialized() else None
        self.sequence_parallel = tp_size > 1 and bool(self.config.sequence_parallel)
        if parallel_mode == "column":
            out_features //= tp_size
        elif parallel_mode == "row":
            in_features //= tp_size
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.return_bias = bias, self.te_return_bias
        self.apply_bias = bias and not self.te_return_bias
        self.params_dtype = self.config.params_dtype
        device = te_device(self.config)
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=self.params_dtype, device=device))
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=self.params_dtype, device=device))
        else:
            self.bias = torch.Tensor().to(dtype=self.params_dtype, device=device)
        if self.config.perform_initialization:
            with torch.no_grad():
                init_method(self.weight)
        _tp(self.weight, 1 if parallel_mode == "row" else 0)
        if bias and parallel_mode == "row":
            self.bias.sequence_parallel = self.sequence_parallel
        elif bias and parallel_mode == "column":
            _tp(self.bias, 0)

    def linear(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """TE Linear's forward: megatron-core's (output, bias) pair."""
        if self.parallel_mode == "column" and self.tp_size > 1:
            if self.sequence_parallel:  # [s / tp, b, h] -> [s, b, h]
                x = gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=True, group=self.tp_group)
            else:
                x = copy_to_tensor_model_parallel_region(x, group=self.tp_group)
        fused_bias = self.bias.to(x.dtype) if self.apply_bias and self.parallel_mode != "row" else None
        out = F.linear(x, self.weight.to(x.dtype), fused_bias)
        if self.parallel_mode == "row" and self.tp_size > 1:
            if self.sequence_parallel:  # summed over TP, each rank keeping its [s / tp] rows
                out = reduce_scatter_to_sequence_parallel_region(out, group=self.tp_group)
            else:
                out = reduce_from_tensor_model_parallel_region(out, group=self.tp_group)
        if self.apply_bias and self.parallel_mode == "row":
            out = out + self.bias.to(out.dtype)
        self.is_first_microbatch = False
        if self.te_return_bias:
            return out, self.bias.to(out.dtype)
        return out, None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.linear(x)

    def backward_dw(self) -> None:
        """Nothing deferred (delay_wgrad_compute is refused)."""

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
        """Replicated over TP and DP (megatron-core uses TELinear directly only in duplicated mode)."""
        assert self.parallel_mode is None, "TELinear sharded_state_dict can only be used with duplicated parallel mode"
        return tp_sharded(self, {}, prefix, sharded_offsets, metadata)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.use_bias}, " \
               f"TP={self.tp_size}"  # fmt: skip


class TEColumnParallelLinear(TELinear):
    """megatron-core's TEColumnParallelLinear: `weight` [output_size / tp, input_size]."""

    def __init__(self, input_size: int, output_size: int, *, config: Any, init_method: Callable,
                 gather_output: bool, bias: bool, skip_bias_add: bool, is_expert: bool,
                 skip_weight_param_allocation: bool = False, tp_comm_buffer_name: str | None = None,
                 tp_group: Any = None, stride: int = 1, name: str | None = None) -> None:  # fmt: skip

        if gather_output:
            raise ValueError("Transformer Engine linear layers do not support gather_output = True")
        tp_group = get_tensor_model_parallel_group_if_none(tp_group, is_expert=is_expert)
        super().__init__(input_size, output_size, parallel_mode="column", config=config, init_method=init_method,
                         bias=bias, skip_bias_add=skip_bias_add, is_expert=is_expert,
                         skip_weight_param_allocation=skip_weight_param_allocation,
                         tp_comm_buffer_name=tp_comm_buffer_name, symmetric_ar_type=config.symmetric_ar_type,
                         tp_group=tp_group, name=name)  # fmt: skip
        self.stride = stride
        self.weight.partition_stride = stride
        if bias:
            self.bias.partition_stride = stride

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
        """Split along dim 0, bias too."""
        return tp_sharded(self, {"weight": 0, "bias": 0}, prefix, sharded_offsets, metadata)


class TERowParallelLinear(TELinear):
    """megatron-core's TERowParallelLinear: `weight` [output_size, input_size / tp], `bias` [output_size] whole."""

    def __init__(self, input_size: int, output_size: int, *, config: Any, init_method: Callable, bias: bool,
                 input_is_parallel: bool, skip_bias_add: bool, is_expert: bool,
                 tp_comm_buffer_name: str | None = None, tp_group: Any = None,
                 name: str | None = None) -> None:  # fmt: skip

        if not input_is_parallel:
            raise ValueError("Transformer Engine linear layers do not support input_is_parallel = False")
        tp_group = get_tensor_model_parallel_group_if_none(tp_group, is_expert=is_expert)
        super().__init__(input_size, output_size, parallel_mode="row", config=config, init_method=init_method,
                         bias=bias, skip_bias_add=skip_bias_add, is_expert=is_expert,
                         skip_weight_param_allocation=False, tp_comm_buffer_name=tp_comm_buffer_name,
                         symmetric_ar_type=config.symmetric_ar_type, tp_group=tp_group, name=name)  # fmt: skip
        if bias and not is_expert:
            self.bias.sequence_parallel = config.sequence_parallel

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
        """Split along dim 1, bias whole."""
        return tp_sharded(self, {"weight": 1}, prefix, sharded_offsets, metadata)


class TELayerNormColumnParallelLinear(TELinear):
    """megatron-core's TELayerNormColumnParallelLinear: TE LayerNormLinear, a norm of the input (weight
    `layer_norm_weight`, replicated) then the column-parallel linear; the bridge maps it by its class name."""

    TE_SOURCE = TeSource("transformer_engine/pytorch/module/layernorm_linear.py", "LayerNormLinear")
    TE_PARAMETERS = (
        ParamRule("layer_norm_weight", ("in_features",), "params_dtype"),
        ParamRule("layer_norm_bias", ("in_features",), "params_dtype"),
        *_LINEAR_PARAMETERS,
    )

    def __init__(self, input_size: int, output_size: int, *, config: Any, init_method: Callable,
                 gather_output: bool, bias: bool, skip_bias_add: bool, is_expert: bool,
                 skip_weight_param_allocation: bool = False, tp_comm_buffer_name: str | None = None,
                 tp_group: Any = None, stride: int = 1, name: str | None = None) -> None:  # fmt: skip

        torch.nn.Module.__init__(self)
        if gather_output:
            raise ValueError("Transformer Engine linear layers do not support gather_output = True")
        if is_expert:
            raise ValueError("Transformer Engine linear layers do not yet support MoE")
        if skip_weight_param_allocation:
            raise ValueError("Transformer Engine linear layers do not support skip_weight_param_allocation")
        if config.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"Transformer Engine does not support {config.normalization}")
        _refuse_unsupported(config)
        self.config = config
        tp_group = get_tensor_model_parallel_group_if_none(tp_group, is_expert=is_expert)
        self._tp_group = tp_group
        self.te_return_bias = skip_bias_add and bias
        self.is_first_microbatch = True
        self.stride = stride
        self.normalization = config.normalization
        self.zero_centered_gamma = config.layernorm_zero_centered_gamma
        self.eps = config.layernorm_epsilon
        device = te_device(config)
        init = torch.zeros if self.zero_centered_gamma else torch.ones
        self.layer_norm_weight = torch.nn.Parameter(init(input_size, dtype=config.params_dtype, device=device))
        if self.normalization != "RMSNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.zeros(input_size, dtype=config.params_dtype, device=device))
        else:
            self.layer_norm_bias = None
        self._te_linear(input_size, output_size, "column", tp_group, get_pg_size(tp_group), bias, init_method)
        for norm_param in (self.layer_norm_weight, self.layer_norm_bias):
            if norm_param is not None:
                norm_param.sequence_parallel = self.sequence_parallel
        self.weight.partition_stride = stride
        if bias:
            self.bias.partition_stride = stride
            self.bias.allreduce = True

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """norm(x) in the norm's dtype, then the column-parallel linear."""
        if self.normalization == "RMSNorm":
            normed = rms_norm(x, self.layer_norm_weight, self.eps, self.zero_centered_gamma)
        else:
            normed = layer_norm(x, self.layer_norm_weight, self.layer_norm_bias, self.eps, self.zero_centered_gamma)
        return self.linear(normed.to(x.dtype))

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
        """Split along dim 0, bias too; the norm's weights replicated."""
        return tp_sharded(self, {"weight": 0, "bias": 0}, prefix, sharded_offsets, metadata)
