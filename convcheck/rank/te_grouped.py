"""`--experts te-grouped`: give each MoE layer the parameter layout of Megatron-Core's TEGroupedMLP, on CPU (with the
local specs; `--spec te` builds megatron-core's own TEGroupedMLP on convcheck's TE stand-in instead).

Transformer Engine cannot be built here, so the SequentialMLP the local spec builds is replaced, after the
provider builds the model and before the import, by a layout-faithful stand-in of TEGroupedMLP (megatron-core
0.19.2 transformer/moe/experts.py:182): `linear_fc1` / `linear_fc2` hold one parameter per LOCAL expert,
`weight{i}` (i in [0, num_local_experts)), shaped as TE's GroupedLinear stores them (`[out, in]`):

- fc1 `weight{i}`: `[2 * moe_ffn / etp, hidden]` (gate|up halves per ETP rank, as Megatron's fc1),
- fc2 `weight{i}`: `[hidden, moe_ffn / etp]`;
- with add_bias_linear (GPT-OSS) also `bias{i}`: fc1 `[2 * moe_ffn / etp]`, fc2 `[hidden]` (whole on every ETP rank).

The submodule classes carry the names `TEColumnParallelGroupedLinear` / `TERowParallelGroupedLinear` because the
bridge's AutoMapping dispatches on the module's class name (param_mapping.py `_MODULE_TYPE_REGISTRY`), and each
carries `config` (read by the mappings' `_get_config`). Parameters get the attributes
`_set_expert_parameter_attributes` (extensions/transformer_engine.py:91) sets: `allreduce=False`,
`tensor_model_parallel=True`, `partition_dim` 0 (fc1) / 1 (fc2), `partition_stride=1`.

This is a test harness of the bridge's naming and sharding, not a mock of the bridge: the real bridge mappings
(`decoder.layers.*.mlp.experts.linear_fc{1,2}.weight*`, `_megatron_local_name_to_global`'s `weight{N}` expert
renumbering, the real TP/EP gathers) run on it. Its forward is the forward of the SequentialMLP it replaced (kept
outside the module tree), whose expert i reads the stand-in's `weight{i}` storage: the same expert math megatron-core
runs, on the parameters the bridge loaded, so the logits oracle checks the grouped layout end to end.
"""

from __future__ import annotations

from typing import Any

import torch

from convcheck.errors import BadInput

EXPERTS_CHOICES = ("sequential", "te-grouped")
"""Values of the `experts` job option: the local spec's SequentialMLP (default) or the TEGroupedMLP layout."""


def _grouped_linear_class(name: str, partition_dim: int) -> type:
    """A parameter-only module named `name` with TE GroupedLinear's per-expert `weight{i}` [out, in]."""

    def __init__(self: Any, num_gemms: int, input_size: int, output_size: int, *, config: Any,
                 dtype: Any, device: Any) -> None:  # fmt: skip
        torch.nn.Module.__init__(self)
        self.config = config
        self.num_gemms = num_gemms
        self.in_features, self.out_features = input_size, output_size
        self.parallel_mode = None  # TEGroupedLinear clears it under explicit expert communication
        self.explicit_expert_comm = True
        for i in range(num_gemms):
            param = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=dtype, device=device))
            param.allreduce = False
            param.tensor_model_parallel = True
            param.partition_dim = partition_dim
            param.partition_stride = 1
            self.register_parameter(f"weight{i}", param)
        for i in range(num_gemms if config.add_bias_linear else 0):  # TE GroupedLinear's `bias{i}` [out]
            bias = torch.nn.Parameter(torch.empty(output_size, dtype=dtype, device=device))
            bias.allreduce = False
            bias.tensor_model_parallel = (
                partition_dim == 0
            )  # row-parallel biases stay whole (transformer_engine.py:116)
            if partition_dim == 0:
                bias.partition_dim, bias.partition_stride = 0, 1
            self.register_parameter(f"bias{i}", bias)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name} stand-in: its TEGroupedMLP runs the experts, not this linear")

    doc = f"Layout-faithful stand-in of megatron-core's {name} (parameters only; the experts module runs them)."
    return type(name, (torch.nn.Module,), {"__init__": __init__, "forward": forward, "__doc__": doc,
                                            "__module__": __name__})  # fmt: skip


_CLASSES: dict[str, type] = {}


def _classes() -> tuple[type, type]:
    """The column (fc1) and row (fc2) stand-in classes, created once per process."""
    if not _CLASSES:
        _CLASSES["column"] = _grouped_linear_class("TEColumnParallelGroupedLinear", 0)
        _CLASSES["row"] = _grouped_linear_class("TERowParallelGroupedLinear", 1)
    return _CLASSES["column"], _CLASSES["row"]


def te_grouped_experts(config: Any, num_local_experts: int, dtype: Any, device: Any, sequential: Any = None) -> Any:
    """A TEGroupedMLP-shaped experts module: `linear_fc1.weight{i}` [2F/etp, hidden], `linear_fc2.weight{i}`
    [hidden, F/etp]; its forward runs `sequential` (the SequentialMLP it stands in for) on those weights."""
    etp = int(getattr(config, "expert_tensor_parallel_size", None) or 1)
    ffn = int(config.moe_ffn_hidden_size)
    if ffn % etp:
        raise BadInput(f"--experts te-grouped: moe_ffn_hidden_size {ffn} is not divisible by ETP {etp}")
    fc1_out = (2 if config.gated_linear_unit else 1) * ffn // etp
    column, row = _classes()

    class TEGroupedMLPLayout(torch.nn.Module):
        """Stand-in of TEGroupedMLP: parameters laid out as in production, the SequentialMLP's forward."""

        def __init__(self) -> None:
            super().__init__()
            self.__dict__["sequential"] = sequential  # not a submodule: its parameters are not the model's
            self.config = config
            self.num_local_experts = num_local_experts
            self.linear_fc1 = column(num_local_experts, config.hidden_size, fc1_out, config=config, dtype=dtype,
                                     device=device)  # fmt: skip
            self.linear_fc2 = row(num_local_experts, ffn // etp, config.hidden_size, config=config, dtype=dtype,
                                  device=device)  # fmt: skip

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            """SequentialMLP.forward(permuted tokens, tokens_per_expert, probs) with expert i on `weight{i}`."""
            sequential = self.__dict__["sequential"]
            if sequential is None:
                raise NotImplementedError("this TEGroupedMLP stand-in was built without the experts it replaces")
            for i, expert in enumerate(sequential.local_experts):
                expert.linear_fc1.weight.data = getattr(self.linear_fc1, f"weight{i}").data
                expert.linear_fc2.weight.data = getattr(self.linear_fc2, f"weight{i}").data
                if self.config.add_bias_linear:
                    expert.linear_fc1.bias.data = getattr(self.linear_fc1, f"bias{i}").data
                    expert.linear_fc2.bias.data = getattr(self.linear_fc2, f"bias{i}").data
            return sequential(*args, **kwargs)

    return TEGroupedMLPLayout()


def install_te_grouped_experts(model: list[Any]) -> int:
    """Replace every MoE layer's SequentialMLP experts by the TEGroupedMLP stand-in; returns how many were replaced."""
    replaced = 0
    for chunk in model:
        for module in list(chunk.modules()):
            experts = getattr(module, "experts", None)
            local = getattr(experts, "local_experts", None)
            if experts is None or local is None:
                continue
            first = next(experts.parameters())
            config = getattr(experts, "config", None) or module.config
            module.experts = te_grouped_experts(config, len(local), first.dtype, first.device, experts)
            replaced += 1
    if not replaced and not getattr(model[0].config, "num_moe_experts", None):
        raise BadInput("--experts te-grouped: the model has no SequentialMLP experts to lay out as TEGroupedMLP")
    return replaced


def apply_experts_option(model: list[Any], experts: str) -> None:
    """Apply the `experts` job option to the freshly built model (before the sentinel fill and the import)."""
    if experts not in EXPERTS_CHOICES:
        raise BadInput(f"unknown --experts {experts!r}; known: {', '.join(EXPERTS_CHOICES)}")
    if experts == "te-grouped":
        install_te_grouped_experts(model)
