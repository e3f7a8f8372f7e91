"""megatron-core's distributed optimizer state across a resume: Adam moments and fp32 main params per element.

The model is wrapped in megatron's DistributedDataParallel and given `get_megatron_optimizer(...,
use_distributed_optimizer=True)`. Before the save every element's moments encode where they belong:
`exp_avg` = the parameter's id + 1 (ids: sorted global parameter names, the same at every layout) and `exp_avg_sq`
= minus the element's fp32 main param (fixture values are distinct within a tensor). After the resume, on every
rank and element, the main param must equal the restored bf16 parameter upcast, `exp_avg` the id of the parameter
it sits in and `exp_avg_sq` minus its main param, all compared bitwise; a moment that moved names where it came from.

On a CPU run this part does not run: megatron-core's DDP and distributed optimizer are CUDA-only (CPU_BLOCKERS).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

from convcheck.compare.bits import first_true, int_view
from convcheck.compat.no_te import install_torch_adam_step
from convcheck.errors import one_line
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding

CPU_BLOCKERS = (
    "megatron/core/distributed/param_and_grad_buffer.py:1162",
    "megatron/core/optimizer/optimizer.py:702",
    "megatron/core/optimizer/distrib_optimizer.py:401",
)
"""Where megatron-core 0.19.2 needs CUDA for DDP + the distributed optimizer: the DDP buffers are allocated on
torch.cuda.current_device(); MixedPrecisionOptimizer.__init__ makes its unit scale with device='cuda';
DistributedOptimizer accepts only torch.cuda.*Tensor parameters (TypeError at :475 otherwise)."""
SHARDING = {"distrib_optim_sharding_type": "fully_reshardable", "chained_optim_avoid_prefix": True}
"""The optimizer checkpoint format that reshards across TP/PP/EP (megatron-core 0.19.2 rejects the default
`fully_sharded_model_space`: "ShardedTensor.flattened_range is not supported")."""
UPSTREAM_CHAIN = (
    "; megatron-core cannot resume across that change: ChainedOptimizer.load_state_dict, "
    "megatron/core/optimizer/optimizer.py:1575, reads the state of one optimizer as one, of several by index"
)
"""Why a resume fails when the number of chained optimizers differs (megatron-core 0.19.2)."""
NOT_RUN_ON_CPU = "not run on CPU (CUDA-only upstream: " + ", ".join(CPU_BLOCKERS) + ")"


@dataclass(kw_only=True)
class OptimizerPart:
    """One rank's DDP-wrapped model chunks, their distributed optimizer and the global parameter ids."""

    ddp: list[Any]
    optimizer: Any
    ids: dict[str, int]
    """Global parameter name -> id (index in the sorted names of every rank)."""
    names: dict[int, str]
    """id(parameter tensor) -> global parameter name, for this rank's parameters."""


def not_run_reason(ctx: RankContext) -> str | None:
    """Why the optimizer part cannot run in this context (None: it can)."""
    return NOT_RUN_ON_CPU if ctx.device == "cpu" else None


def build(ctx: RankContext) -> OptimizerPart:
    """Collective: wrap the model in megatron DDP and build the distributed Adam optimizer over it."""

    install_torch_adam_step()

    config = ctx.model[0].config
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
    ddp = [
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
        for i, chunk in enumerate(ctx.model)
    ]
    bf16 = bool(getattr(config, "bf16", False))
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=1e-4,
        use_distributed_optimizer=True,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
    )
    optimizer = get_megatron_optimizer(opt_config, ddp)
    local = dict(ctx.named_parameters())
    everything = sorted(set().union(*ctx.gather(sorted(local))))
    return OptimizerPart(
        ddp=ddp,
        optimizer=optimizer,
        ids={name: i for i, name in enumerate(everything)},
        names={id(t): n for n, t in local.items()},
    )


def _optimizers(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def shards(part: OptimizerPart) -> list[tuple[str, Any, Any, dict[str, Any]]]:
    """(global name, this rank's slice of the model param, fp32 main param, its Adam state) per owned shard, through
    megatron's own accessor (`_get_main_param_and_optimizer_states`)."""
    out = []
    for opt in _optimizers(part.optimizer):
        for group in (*opt.model_float16_groups, *opt.model_fp32_groups):
            for param in group:
                rng = opt._get_model_param_range_map(param)["param"]
                piece = param.detach().view(-1)[rng.start : rng.end]
                main = opt._get_main_param_and_optimizer_states(param)["param"]
                out.append((part.names[id(param)], piece, main, opt.optimizer.state[main]))
    return out


def init_states(part: OptimizerPart) -> None:
    """Create the Adam state tensors (megatron's own init_state_fn) on every owned shard, at Adam step 1 (the
    optimizer's state_dict reads the step torch's Adam keeps per parameter)."""
    for opt in _optimizers(part.optimizer):
        opt.init_state_fn(opt.optimizer, opt.config)
    for *_, state in shards(part):
        state.setdefault("step", torch.tensor(1.0))


def encode(part: OptimizerPart) -> None:
    """Set every shard's main param to its model param upcast and its moments to the (parameter, element) code."""
    init_states(part)
    with torch.no_grad():
        for name, piece, main, state in shards(part):
            main.copy_(piece.float())
            state["exp_avg"].fill_(float(part.ids[name] + 1))
            state["exp_avg_sq"].copy_(-main)


def fill_nan(part: OptimizerPart) -> None:
    """Before a restore: main params and moments at NaN, so anything the load skips shows."""
    init_states(part)
    with torch.no_grad():
        for _, _, main, state in shards(part):
            main.fill_(float("nan"))
            state["exp_avg"].fill_(float("nan"))
            state["exp_avg_sq"].fill_(float("nan"))


def sharded_entries(part: OptimizerPart, loading: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The "optimizer" entry of the checkpoint state, built from the model's sharded state dict."""

    def entries(model_state: dict[str, Any]) -> dict[str, Any]:
        model_sd = model_state.get("model") or model_state
        return {"optimizer": part.optimizer.sharded_state_dict(model_sd, is_loading=loading, metadata=SHARDING)}

    return entries


def apply_loaded(part: OptimizerPart, loaded: dict[str, Any]) -> str | None:
    """Hand the loaded optimizer state to the optimizer, as a trainer's resume does; one line when that raised.

    The line says how many chained optimizer states (dense, expert) the checkpoint holds and how many this layout
    builds: megatron-core gives experts their own optimizer only where they use expert process groups (EP > 1 or
    ETP != TP, tensor_parallel/layers.py:961), so an EP2 checkpoint holds two and a TP1 model builds one."""
    state = loaded.get("optimizer")
    try:
        part.optimizer.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - reported as a finding, never a silent pass
        saved = len([k for k in state if isinstance(k, int)]) if isinstance(state, dict) else 0
        now = len(_optimizers(part.optimizer))
        return (
            f"optimizer.load_state_dict raised {one_line(exc)} (the checkpoint holds {saved or 1} chained optimizer "
            f"state(s), this layout builds {now}{UPSTREAM_CHAIN if (saved or 1) != now else ''})"
        )
    return None


def check(ctx: RankContext, part: OptimizerPart, where: str) -> tuple[int, list[Finding]]:
    """Collective: (elements checked on every rank, findings on rank 0) for the restored optimizer state."""
    by_id = {i: n for n, i in part.ids.items()}
    checked, findings = 0, []
    for name, piece, main, state in shards(part):
        checked += main.numel()
        expected_avg = float(part.ids[name] + 1)
        main_bits, model_bits = int_view(main), int_view(piece.float())
        if bool((main_bits != model_bits).any()):
            k = first_true(main_bits != model_bits)
            findings.append(
                _finding(
                    name,
                    "main-param-differs",
                    f"fp32 main param element {k} of this shard is "
                    f"{main[k].item()!r}, the restored parameter holds {piece[k].item()!r}",
                    where,
                )
            )
        avg = state["exp_avg"].reshape(-1)
        wrong = (avg != expected_avg).nonzero()
        if wrong.numel():
            k = int(wrong[0, 0])
            value = avg[k].item()
            origin = (
                by_id.get(int(value) - 1, "no parameter") if math.isfinite(value) and value >= 1 else "no parameter"
            )
            findings.append(
                _finding(
                    name,
                    "moment-misplaced",
                    f"exp_avg element {k} of this shard belongs to "
                    f"{origin} (code {value!r}, expected {expected_avg!r})",
                    where,
                )
            )
        sq_bits, neg_bits = int_view(state["exp_avg_sq"]), int_view(-main)
        if bool((sq_bits != neg_bits).any()):
            k = first_true(sq_bits != neg_bits)
            findings.append(
                _finding(
                    name,
                    "moment-misplaced",
                    f"exp_avg_sq element {k} of this shard is "
                    f"{state['exp_avg_sq'].reshape(-1)[k].item()!r}, expected minus its main param "
                    f"{(-main[k]).item()!r}",
                    where,
                )
            )
    totals = ctx.gather((checked, findings))
    if not ctx.is_reporter:
        return 0, []
    return sum(c for c, _ in totals), [f for _, fs in totals for f in fs]


def _finding(name: str, kind: str, message: str, where: str) -> Finding:
    return Finding(tensor=name, kind=kind, message=f"{where}: {message}", detail={"phase": where})
