"""distckpt oracle: a Megatron distributed checkpoint (torch_dist) saved at the run's layout resumes at another.

Design: a resume layout needs its own process groups (and maybe another world size), so the engine runs it as a
second launch (convcheck.engine.resume). In the first launch this oracle compares the export with the source and saves
the loaded model's sharded state dict into the folder the engine owns (`ctx.checkpoint_dir`); in each resume job
(`ctx.resuming`) it restores that folder into a fresh NaN-filled model and compares that export with the source.
The engine folds the phases into one verdict. Opt-in: `--oracle distckpt [--resume-layout tp1]`.
"""

from __future__ import annotations

from convcheck.ckpt.phases import resume_phase, save_phase
from convcheck.oracles.base import OracleInfo
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "distckpt"
INFO = OracleInfo(
    name=NAME,
    proves="the model saved with megatron-core dist_checkpointing (torch_dist) at the run's layout and restored into "
    "a fresh NaN-filled model at --resume-layout (a separate launch each, TP1 by default) restores every "
    "sharded key and every element, and the HF exports at both layouts are byte-identical to the source; "
    "on CUDA also that every Adam moment and fp32 main param of the distributed optimizer stays with its "
    "element",
    does_not_prove="other save strategies (async, fully parallel) or a trainer's own resume logic (iteration, RNG, "
    "data state); on a CPU run the optimizer state (megatron-core's DDP and distributed optimizer are "
    "CUDA-only there: reported as not run)",
    default=False,
)


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: the save phase in the first launch, the resume phase in a resume job; rank 0 returns the verdict."""
    if not ctx.checkpoint_dir:
        if not ctx.is_reporter:
            return None
        message = "no checkpoint folder: the engine provides one (`convcheck verify --oracle distckpt`)"
        return make_verdict(NAME, checked=0, findings=[Finding(tensor="<distckpt>", kind="no-folder", message=message)])
    phase = resume_phase(ctx, ctx.checkpoint_dir) if ctx.resuming else save_phase(ctx, ctx.checkpoint_dir)
    if not ctx.is_reporter:
        return None
    return make_verdict(NAME, checked=phase.checked, findings=phase.findings, rows=phase.rows, metrics=phase.metrics)
