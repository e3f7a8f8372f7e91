"""Where this process stands under a torchrun that runs `convcheck` itself (`torchrun ... -m convcheck verify`), read
from torchrun's environment (the launcher side's part of convcheck.engine.inplace)."""

from __future__ import annotations

import os

from convcheck.engine.job import Job
from convcheck.engine.launch import LAUNCHED
from convcheck.errors import BadInput


def inside_torchrun() -> bool:
    """True when this process is a worker torchrun started to run `convcheck` itself (not one of convcheck's ranks)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ and LAUNCHED not in os.environ


def torchrun_place() -> tuple[int, int, int, int]:
    """(rank, world, node, nodes) of this process as torchrun set them."""
    env = os.environ
    return (int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("GROUP_RANK", "0")),
            int(env.get("GROUP_WORLD_SIZE", "1")))  # fmt: skip


def check_here(job: Job) -> None:
    """BadInput unless torchrun started exactly the ranks the layout needs, and the job needs no launch of its own."""
    _rank, world, _node, _nodes = torchrun_place()
    if world != job.layout.world_size:
        raise BadInput(
            f"torchrun started {world} processes but the layout {job.layout.label} needs {job.layout.world_size}"
        )
    if job.resume_layouts:
        raise BadInput("the distckpt oracle resumes in launches of its own: run it with `convcheck verify`, not "
                       "inside torchrun")  # fmt: skip
    if job.nodes is not None:
        raise BadInput("--nnodes starts torchrun on each node: inside torchrun, give torchrun's own --nnodes instead")
