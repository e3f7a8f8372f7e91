"""distckpt oracle: a Megatron distributed checkpoint (torch_dist) saved at the run's layout resumes at another.

Design: a resume layout needs its own process groups (and maybe another world size), so the engine runs it as a
second launch (convcheck.engine.resume). In the first launch this oracle compares the export with the source and saves
the loaded model's sharded state dict into the folder the engine owns (`ctx.checkpoint_dir`); in each resume job
(`ctx.resuming`) it restores that folder into a fresh NaN-filled model and compares that export with the source.
The engine folds the phases into one verdict. Opt-in: `--oracle distckpt [--resume-layout tp1]`.
"""

from __future__ import annotations

from convcheck.ckpt.phases import resume_phase, save_phase
from convcheck.oracles import ORACLES
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "distckpt"
INFO = ORACLES[NAME]


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
