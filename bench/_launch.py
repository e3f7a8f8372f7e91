"""What the benches that time work inside ranks share: relaunch the bench script under torchrun and pass on rank 0's
JSON line (the launcher side), and one rank's bring-up of the model (the rank side)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]


def launch(script: str, world: int, args: list[str]) -> None:
    """Run `script` with `args` on `world` torchrun ranks (one thread each, this checkout first on the path) and
    write the last JSON line rank 0 printed; on failure, the tails of both streams on stderr and the exit code."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))  # a device's wheels stay
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", script, *args]
    with tempfile.TemporaryDirectory(prefix="convcheck-bench-") as tmp:  # torchrun's torchelastic_* folders go with it
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "TMPDIR": tmp}
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        sys.exit(proc.returncode or 1)
    sys.stdout.write(lines[-1] + "\n")


@contextlib.contextmanager
def rank_up(path: str, layout: Any, device: str = "cpu", load: bool = True) -> Iterator[Any]:
    """This rank's RankContext with the checkpoint at `path` loaded at `layout` (convcheck's own rank code, standing
    for a trainer's; `load` False keeps megatron's random init); the process group is shut down after the block."""
    from convcheck.rank.bringup import bring_up, quiet
    from convcheck.rank.dist import shutdown_distributed
    from convcheck.rank.spec import RankSpec

    quiet()
    ctx = bring_up(RankSpec(model_path=path, layout=layout, device=device), load=load)
    try:
        yield ctx
    finally:
        shutdown_distributed()


@contextlib.contextmanager
def profiled(rank: int, part: str = "") -> Iterator[None]:
    """cProfile around the block on this rank when CONVCHECK_BENCH_PROFILE=FILE (ranks: CONVCHECK_BENCH_PROFILE_RANKS,
    default 0); the stats go to FILE[.part].rankN (read them with pstats; time spent waiting in collectives shows
    there). With FILE ending in .txt and pyinstrument installed, a sampling profile's text goes there instead: its
    low overhead keeps the proportions of many small calls and it follows generators into the export."""
    target = os.environ.get("CONVCHECK_BENCH_PROFILE")
    if not target or str(rank) not in os.environ.get("CONVCHECK_BENCH_PROFILE_RANKS", "0").split(","):
        yield
        return
    out = f"{target.removesuffix('.txt')}{'.' + part if part else ''}.rank{rank}"
    if target.endswith(".txt"):
        from pyinstrument import Profiler

        sampler = Profiler(interval=0.0005)
        sampler.start()
        try:
            yield
        finally:
            sampler.stop()
            Path(out + ".txt").write_text(sampler.output_text(unicode=False, show_all=False))
        return
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        prof.dump_stats(out)


def timed(ctx: Any, work: Any) -> tuple[float, float, Any]:
    """(wall seconds, this rank's CPU seconds, result) of `work()` for the whole job: the clock starts after a barrier
    every rank leaves together and stops after a barrier every rank reaches once done (on a GPU, once its queued
    kernels are done too), so a rank that reaches the work late, or ends it late, counts as the job waits on it."""
    import time

    t0, c0 = _settled(ctx), time.process_time()
    result = work()
    c1 = time.process_time()
    return _settled(ctx) - t0, c1 - c0, result


def _settled(ctx: Any) -> float:
    import time

    import torch
    import torch.distributed as dist

    if ctx.device == "cuda":
        torch.cuda.synchronize()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    return time.perf_counter()
