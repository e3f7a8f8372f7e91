"""The sharded state dicts megatron-core's TE classes give a distributed checkpoint
(megatron/core/extensions/transformer_engine.py: TELinear :1092, TELayerNormColumnParallelLinear :1347,
TEColumnParallelLinear :1485, TERowParallelLinear :1740, TEDotProductAttention :2083, TEGroupedLinear :2486), for the
stand-in: the same keys, TP axes, expert offsets and replica ids. TE's `_extra_state` (FP8 metadata, empty without
FP8) is not stood in for: a checkpoint of the stand-in has no `_extra_state` entries."""

from __future__ import annotations

from typing import Any

from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint
from megatron.core.utils import get_pg_rank, get_pg_size


def tp_sharded(module: Any, axes: dict[str, int], prefix: str, sharded_offsets: tuple, metadata: Any) -> Any:
    """`module`'s parameters as sharded tensors split along `axes` over its TP group (replicated otherwise)."""
    metadata = ensure_metadata_has_dp_cp_group(metadata)
    state_dict = module.state_dict(prefix="", keep_vars=True)
    return make_sharded_tensors_for_checkpoint(state_dict, prefix, axes, sharded_offsets, tp_group=module._tp_group,
                                               dp_cp_group=metadata["dp_cp_group"])  # fmt: skip


def grouped_sharded(module: Any, axes: dict[str, int], prefix: str, sharded_offsets: tuple, metadata: Any) -> Any:
    """TEGroupedLinear's per-expert sharded tensors: `weight{i}` / `bias{i}` of global expert E at offset
    (ep_axis, E, experts) along `axes` over expert TP, replica ids over expert DP."""
    metadata = ensure_metadata_has_dp_cp_group(metadata)
    singleton = metadata.get("singleton_local_shards", False)
    pgs = module._pg_collection
    experts = get_pg_size(pgs.ep) * module.num_gemms
    first = get_pg_rank(pgs.ep) * module.num_gemms
    ep_axis = len(sharded_offsets)
    out = {}
    for i in range(module.num_gemms):
        expert = first + i
        state = {f"{i}.weight": getattr(module, f"weight{i}")}
        if module.use_bias:
            state[f"{i}.bias"] = getattr(module, f"bias{i}")
        offsets = sharded_offsets if singleton else (*sharded_offsets, (ep_axis, expert, experts))
        gemm_axes = {f"{i}.{name}": axis for name, axis in axes.items()}
        sub = make_sharded_tensors_for_checkpoint(state, "", gemm_axes, offsets, tp_group=module._tp_group,
                                                  dp_cp_group=metadata["dp_cp_group"])  # fmt: skip
        replace_prefix_for_sharding(sub, f"{i}.", f"{expert}.{prefix}" if singleton else prefix)
        out[f"{prefix}weight{i}"] = sub[f"{i}.weight"]
        if module.use_bias:
            out[f"{prefix}bias{i}"] = sub[f"{i}.bias"]
    for tensor in out.values():
        tensor.replica_id = (*tensor.replica_id[:2], get_pg_rank(pgs.expt_dp))
    return out
