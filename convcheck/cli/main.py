"""The `convcheck` command line: thin click commands over the library."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from convcheck.api import EXPERT_LAYOUTS
from convcheck.cli.types import HookSpecType, OracleList
from convcheck.errors import ConvcheckError

if TYPE_CHECKING:
    from convcheck.layout import ParallelLayout

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


def _fail_line(exc: BaseException) -> None:
    click.echo(f"convcheck: error: {exc}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def replay_command(
    model: str,
    layout: "ParallelLayout",
    device: str,
    oracles: list[str],
    hooks: tuple[str, ...],
    experts: str = "sequential",
) -> str:
    """One shell line that reruns exactly the failing oracles of this run."""
    import shlex

    args = ["convcheck", "verify", "--model", model]
    for key, value in (("tp", layout.tp), ("pp", layout.pp), ("ep", layout.ep), ("etp", layout.etp)):
        if value != 1:
            args += [f"--{key}", str(value)]
    if device != "cpu":
        args += ["--device", device]
    if experts != "sequential":
        args += ["--experts", experts]
    args += ["--oracle", ",".join(oracles)]
    for hook in hooks:
        args += ["--hook", hook]
    return shlex.join(args)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="convcheck")
def cli() -> None:
    """Prove Megatron-Core <-> Hugging Face weight conversions correct."""


@cli.command()
@click.option("--model", required=True, help="HF checkpoint folder, or a built-in fixture such as tiny:qwen3-moe.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor parallel size.")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline parallel size.")
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True, help="Expert parallel size.")
@click.option("--etp", type=click.IntRange(min=1), default=1, show_default=True, help="Expert tensor parallel size.")
@click.option("--oracle", "oracles", type=OracleList(), default="", help="Comma-separated oracle names (default: all).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), help="Write the report as JSON.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, writable=True), help="Write JUnit XML.")
@click.option("--table", type=click.Choice(["all", "failures", "none"]), default="all", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds before hung or dead ranks are stopped (exit 2).")  # fmt: skip
@click.option("--log-dir", type=click.Path(file_okay=False), help="Keep the job file and rank logs here.")
@click.option("--hook", "hooks", type=HookSpecType(), multiple=True,
              help="Callable run in every rank before the model is built (extensions, planted-bug tests).")  # fmt: skip
@click.option("--experts", type=click.Choice(EXPERT_LAYOUTS), default="sequential", show_default=True,
              help="MoE expert layout: SequentialMLP, or TEGroupedMLP's linear_fcN.weightE (no forward: no logits).")  # fmt: skip
def verify(
    model: str,
    tp: int,
    pp: int,
    ep: int,
    etp: int,
    oracles: tuple[str, ...],
    device: str,
    json_path: str | None,
    junit_path: str | None,
    table: str,
    timeout: float,
    log_dir: str | None,
    hooks: tuple[str, ...],
    experts: str,
) -> None:
    """Build the sharded Megatron model from MODEL through the real bridge and run the oracles."""
    from convcheck import api
    from convcheck.layout import ParallelLayout
    from convcheck.verdict import PASS

    try:
        layout = ParallelLayout(tp=tp, pp=pp, ep=ep, etp=etp)
        job = api.prepare(
            model, layout, oracles=oracles, device=device, hooks=hooks, experts=experts, timeout_s=timeout
        )
        for target in (json_path, junit_path):
            if target and not Path(target).resolve().parent.is_dir():
                raise ConvcheckError(f"output folder does not exist: {Path(target).parent}")
        report = api.run(job, log_dir=log_dir)
    except ConvcheckError as exc:
        _fail_line(exc)
    from convcheck.cli.render import print_report, write_json, write_junit

    print_report(report, table=table)
    if report.verdict != PASS:
        failing = [o.name for o in report.oracles if o.verdict != PASS]
        click.echo(f"replay: {replay_command(model, layout, device, failing, hooks, experts)}")
    if json_path:
        write_json(report, json_path)
    if junit_path:
        write_junit(report, junit_path)
    sys.exit(EXIT_PASS if report.verdict == PASS else EXIT_FAIL)


@cli.command(name="oracles")
def list_oracles() -> None:
    """List the oracles: what each proves and what it does not."""
    from convcheck.oracles import ORACLES

    for info in ORACLES.values():
        click.echo(f"{info.name}\n  proves: {info.proves}\n  does not prove: {info.does_not_prove}")


@cli.group()
def fixtures() -> None:
    """Tiny deterministic HF checkpoints for tests and demos."""


@fixtures.command(name="list")
def fixtures_list() -> None:
    """List the built-in fixtures."""
    from convcheck.fixtures import FIXTURES

    for spec in FIXTURES.values():
        click.echo(f"tiny:{spec.name:<12} {spec.description}")


@fixtures.command(name="build")
@click.argument("name")
@click.option("--out", type=click.Path(file_okay=False), help="Folder to build into (default: the cache).")
def fixtures_build(name: str, out: str | None) -> None:
    """Build fixture NAME (or reuse the cached copy); the last line printed is its folder."""
    from convcheck.fixtures import build_fixture

    try:
        click.echo(str(build_fixture(name, out)))
    except ConvcheckError as exc:
        _fail_line(exc)


def main() -> None:
    """Console-script entry point: usage errors are one line on stderr and exit 2, like every bad input."""
    try:
        code = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("convcheck: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"convcheck: error: {exc.format_message()}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(code or 0)


cli.add_command(__import__("convcheck.cli.selftest", fromlist=["selftest"]).selftest)
