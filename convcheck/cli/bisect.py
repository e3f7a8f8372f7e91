"""`convcheck bisect`: the first commit of a Megatron-Bridge history whose gate case (or verify) changes."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import click

from convcheck.cache import cache_root
from convcheck.cli.types import HookSpecType
from convcheck.errors import ConvcheckError

EXIT_FOUND, EXIT_NOT_FOUND, EXIT_BAD_INPUT = 0, 1, 2

BISECT_EPILOG = """\b
Exit codes:
  0    found: the first commit whose manifest (or verify verdict) differs from the good commit's
  1    not found: the bad commit gives the good result, or only skipped commits are left
  2    bad input (not a git repository, unknown ref, unknown case, good not an ancestor of bad); one line on stderr

\b
Example:
  convcheck bisect --bridge-repo ~/Megatron-Bridge --good 558587ede --bad main --case qwen3/tp2+pad128
"""


@click.command(epilog=BISECT_EPILOG)
@click.option("--bridge-repo", required=True, type=click.Path(file_okay=False),
              help="A git clone of Megatron-Bridge (bare or with a work tree).")  # fmt: skip
@click.option("--good", required=True, help="A commit, tag or branch with the good result.")
@click.option("--bad", required=True, help="A later commit, tag or branch with the bad result.")
@click.option("--case", "case_id", default=None, help="The gate case whose manifest is compared, e.g. qwen3/tp2.")
@click.option("--verify", "verify_args", default=None,
              help="Instead of --case: arguments of `convcheck verify` (exit 0 good, 1 bad, else skip).")  # fmt: skip
@click.option("--hook", "hooks", type=HookSpecType(), multiple=True,
              help="Loaded in every rank of every step before the bridge is imported, run before the model is "
              "built (e.g. examples/bisect_hooks.py:stub_fla).")  # fmt: skip
@click.option("--core", default=None,
              help="megatron-core of every step: a version, source tree or wheel (default: the pins of the "
              "release nearest the bad commit).")  # fmt: skip
@click.option("--transformers", default=None, help="transformers version of every step (default: those pins').")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Commits tested at once (each launch takes the ranks' cores).")  # fmt: skip
@click.option("--env-dir", type=click.Path(file_okay=False), default=None,
              help="Where the per-commit environments are cached (default: CACHE/bisect-envs).")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds per step before hung ranks are stopped (the commit is then skipped).")  # fmt: skip
def bisect(
    bridge_repo: str,
    good: str,
    bad: str,
    case_id: str | None,
    verify_args: str | None,
    hooks: tuple[str, ...],
    core: str | None,
    transformers: str | None,
    jobs: int,
    env_dir: str | None,
    timeout: float,
) -> None:
    """Bisect the bridge's history between GOOD and BAD, building each commit's environment (cached)."""
    from convcheck.gate.case import default_matrix, select
    from convcheck.workflows.bisect import Spec
    from convcheck.workflows.bisect import bisect as run_bisect
    from convcheck.workflows.candidate_env import REPO

    started = time.perf_counter()
    try:
        if case_id:
            select(default_matrix(), ids=(case_id,))
        base = Path(os.environ.get("CONVCHECK_BASE_VENV", REPO / ".venv")).absolute()
        spec = Spec(repo=str(Path(bridge_repo).absolute()), good=good, bad=bad, case=case_id,
                    verify=tuple(shlex.split(verify_args or "")), hooks=hooks, core=core, transformers=transformers,
                    jobs=jobs, timeout_s=timeout, env_dir=Path(env_dir or cache_root() / "bisect-envs").absolute(),
                    base=base)  # fmt: skip
        outcome = run_bisect(spec, note=lambda line: click.echo(line, err=True))
    except ConvcheckError as exc:
        click.echo(f"convcheck: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    for step in outcome.steps:
        if step.state == "skip":
            click.echo(f"SKIPPED {step.commit[:9]} {step.subject}: {step.why}")
    tested = len(outcome.steps)
    summary = (f"{outcome.commits} commit(s) after good, {tested} tested "
               f"({sum(s.state == 'skip' for s in outcome.steps)} skipped), pins of release {outcome.pins}, "
               f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    first = outcome.first_bad
    if first is None:
        click.echo(f"NOT FOUND: {outcome.reason}")
        for commit in outcome.open_range:
            click.echo(f"  {commit[:9]}")
        click.echo(f"bisect: {summary}")
        sys.exit(EXIT_NOT_FOUND)
    click.echo(f"FOUND first bad commit {first.commit} {first.subject}")
    for line in first.differences:
        click.echo(f"  {line}")
    click.echo(f"bisect: {summary}")
    sys.exit(EXIT_FOUND)
