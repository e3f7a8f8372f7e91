"""The job's process groups as a live check uses them: from its ProcessGroupCollection when given (checked against
parallel_state and the model's own collection, which the pinned bridge's export reads), else from parallel_state;
turned into a pure layout (ParallelLayout, RankCoord) for everything below."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from convcheck.errors import BadInput
from convcheck.layout import ParallelLayout, RankCoord
from convcheck.rank.dist import parallel_state_group

AXES = (("tp", "tp"), ("pp", "pp"), ("ep", "ep"), ("etp", "expt_tp"), ("dp", "dp"))
"""convcheck's axis -> the ProcessGroupCollection field that holds its group."""


@dataclass(frozen=True)
class JobGroups:
    """The groups convcheck's own collectives use, and the pure layout and coordinates read from them."""

    groups: dict[str, Any]
    layout: ParallelLayout
    coord: RankCoord


def parallel_state_groups() -> dict[str, Any]:
    """parallel_state's group along each axis of AXES."""
    return {axis: parallel_state_group(axis) for axis, _ in AXES}


def model_collection(chunks: list[Any]) -> Any:
    """The ProcessGroupCollection the model was built with (megatron-core's LanguageModule.pg_collection, where the
    bridge's export reads its groups), or None."""
    inner = getattr(chunks[0], "language_model", None) or chunks[0]
    return getattr(inner, "pg_collection", None)


def members(group: Any) -> tuple[int, ...]:
    """The global ranks of `group`."""
    return tuple(dist.get_process_group_ranks(group))


def disagreement(given: dict[str, Any], chunks: list[Any]) -> str | None:
    """Why the collection's groups cannot be used (one line), or None: each must hold the ranks parallel_state's
    group holds (the pinned bridge reads it) and the ranks of the model's own collection (its export's groups)."""
    ours, built = parallel_state_groups(), model_collection(chunks)
    for axis, field in AXES:
        if given.get(axis) is None:
            continue
        mine = members(given[axis])
        if mine != members(ours[axis]):
            return (
                f"live: pg_collection.{field} holds ranks {list(mine)} on rank {dist.get_rank()}, parallel_state's "
                f"{axis} group {list(members(ours[axis]))}; the pinned megatron-bridge's export reads parallel_state, "
                "so a collection that disagrees with it is refused"
            )
        theirs = getattr(built, field, None) if built is not None else None
        if theirs is not None and members(theirs) != mine:
            return (
                f"live: pg_collection.{field} holds ranks {list(mine)} on rank {dist.get_rank()}, the model's own "
                f"pg_collection.{field} {list(members(theirs))}; the bridge's export uses the model's groups"
            )
    return None


def job_groups(chunks: list[Any], pg_collection: Any = None) -> JobGroups:
    """The job's groups (the collection's where it sets them, else parallel_state's) with their layout and this rank's
    coordinates; BadInput for a collection that is not one or disagrees (see `disagreement`)."""
    groups = parallel_state_groups()
    if pg_collection is not None:
        if not all(hasattr(pg_collection, field) for field in ("tp", "pp")):
            raise BadInput(
                "live: pg_collection must be a megatron.core ProcessGroupCollection, got "
                f"{type(pg_collection).__name__}"
            )
        given = {axis: getattr(pg_collection, field, None) for axis, field in AXES}
        problem = disagreement(given, chunks)
        if problem is not None:
            raise BadInput(problem)
        groups.update({axis: group for axis, group in given.items() if group is not None})
    config = chunks[0].config
    size = {axis: dist.get_world_size(group) for axis, group in groups.items()}
    layout = ParallelLayout(
        tp=size["tp"],
        pp=size["pp"],
        ep=size["ep"],
        etp=size["etp"],
        vpp=len(chunks),
        pp_first=getattr(config, "num_layers_in_first_pipeline_stage", None),
        pp_last=getattr(config, "num_layers_in_last_pipeline_stage", None),
        pp_embed=bool(getattr(config, "account_for_embedding_in_pipeline_split", False)),
        pp_loss=bool(getattr(config, "account_for_loss_in_pipeline_split", False)),
    )
    rank = {axis: dist.get_rank(group) for axis, group in groups.items()}
    coord = RankCoord(tp_rank=rank["tp"], ep_rank=rank["ep"], etp_rank=rank["etp"], pp_rank=rank["pp"])
    return JobGroups(groups=groups, layout=layout, coord=coord)
