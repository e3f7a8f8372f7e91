"""`torchrun ... -m convcheck verify ...`: the processes torchrun started are the ranks; no second launch.

Each process runs the job's oracles as a worker would, rank 0's result goes to every rank over the job's own process
group, and every process ends with the verdict's exit code. Ranks of one node share a job folder under the system
temp dir (or under --log-dir), removed at the end unless --log-dir was given.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch.distributed as dist

from convcheck.engine import rank_run
from convcheck.engine.job import Job
from convcheck.engine.place import check_here, torchrun_place
from convcheck.rank.dist import shutdown_distributed
from convcheck.rank.quiet import quiet


def run_here(job: Job, log_dir: str | None = None) -> dict[str, Any]:
    """Run `job` in this process, one rank of it; every rank returns rank 0's result (collective)."""
    check_here(job)
    rank, _world, node, _nodes = torchrun_place()
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    base = Path(log_dir) if log_dir else Path(tempfile.gettempdir())
    workdir = base / f"convcheck-torchrun-{run_id}-{os.environ.get('MASTER_PORT', '0')}-node{node}"
    workdir.mkdir(parents=True, exist_ok=True)
    if job.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # as for convcheck's own CPU ranks: upstream takes its CPU paths
    quiet()
    job = replace(job, workdir=str(workdir))
    done = False
    try:
        shared = _share(rank_run.run_job(job), rank)
        done = True
        return shared
    finally:  # after a failure no barrier: torchrun stops the other ranks when this one exits
        if os.environ.get("LOCAL_RANK", "0") == "0" and not log_dir:
            shutil.rmtree(workdir, ignore_errors=True)
        if done:
            shutdown_distributed()


def _share(result: dict[str, Any] | None, rank: int) -> dict[str, Any]:
    """Rank 0's result on every rank (the job's default process group), once every rank is done with the folder."""
    box = [result if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    dist.barrier()
    return box[0]
