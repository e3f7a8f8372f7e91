"""`convcheck selftest`: run the mutant catalog against the installed stack and print the kill matrix."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click

from convcheck.atomic import write_json_atomic
from convcheck.cli.nodes import end_on_other_node, node_options, nodes_of
from convcheck.engine.nodes import reports as node_reports
from convcheck.engine.warm_client import serving
from convcheck.errors import ConvcheckError
from convcheck.mutants.catalog import MUTANTS
from convcheck.versions import versions
from convcheck.workflows import selftest as lib

_STATUS = {
    "killed": "[green]KILLED[/green]",
    "survived": "[bold red]SURVIVED[/bold red]",
    "errored": "[bold red]ERRORED[/bold red]",
    "skipped": "[dim]SKIPPED[/dim]",
}
_MARK = {"caught": "[green]caught[/green]", "missed": "[red]missed[/red]", "error": "[red]error[/red]",
         "n/a": "[dim]n/a[/dim]", "not run": "[dim]-[/dim]"}  # fmt: skip


@click.command(name="selftest")
@click.option("--model", "models", multiple=True, metavar="tiny:NAME",
              help="Only the mutants on this fixture (repeatable; default: every mutant).")  # fmt: skip
@click.option("--quick", is_flag=True,
              help="One layout per mutant, mutants with disjoint targets sharing a launch, "
              "only the oracles needed.")  # fmt: skip
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, writable=True), help="Write the kill matrix as JSON."
)
@click.option("--only", "only", default="", hidden=True, help="Comma-separated mutant names (tests).")
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds before one launch's hung or dead ranks are stopped.")  # fmt: skip
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              envvar="CONVCHECK_DEVICE",
              help="As verify's --device, for every launch; with cuda, launches needing more GPUs than visible are "
              "skipped and listed.")  # fmt: skip
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Fixture x layouts run at a time (each launch's ranks need cores, or a GPU each).")  # fmt: skip
@click.option("--warm/--no-warm", default=True, show_default=True,
              help="CPU launches fork fresh ranks from one server that imported megatron once (~2 s a launch, not "
              "~20); --no-warm starts every launch with torchrun.")  # fmt: skip
@node_options
def selftest(models: tuple[str, ...], quick: bool, json_path: str | None, only: str, timeout: float, device: str,
             jobs: int, warm: bool, **node_params: Any) -> None:  # fmt: skip
    """Plant every catalogued bug in the real bridge and check that an oracle catches each, with a clean run of
    every fixture x layout used (exit 1 if a mutant survives or a clean run fails). With --nnodes, launches span
    the hosts (TP1 ones run on each by itself); node 0 prints the matrix and writes --json."""
    try:
        nodes = nodes_of(node_params)
        lib.check_jobs(jobs, nodes)
        problems = lib.check_catalog(MUTANTS)
        if problems:
            raise ConvcheckError(f"mutant catalog: {problems[0]}")
        names = tuple(n.strip() for n in only.split(",") if n.strip())
        chosen = lib.select(MUTANTS, models, names)
        if json_path and not Path(json_path).resolve().parent.is_dir():
            raise ConvcheckError(f"output folder does not exist: {Path(json_path).parent}")
    except ConvcheckError as exc:
        click.echo(f"convcheck: error: {exc}", err=True)
        sys.exit(2)
    mode = "quick" if quick else "full"
    warm = warm and device != "cuda"
    launcher = "warm CPU ranks" if warm else "torchrun"
    reports = node_reports(nodes)  # another node prints one line at the end and writes nothing
    if reports:
        click.echo(f"selftest ({mode}, --device {device}, --jobs {jobs}, {launcher}): {len(chosen)} mutant(s); "
                   f"{_versions_line()}")  # fmt: skip
    try:
        with serving(wait_s=180.0) if warm else nullcontext():
            result = lib.run_selftest(chosen, quick=quick, progress=click.echo if reports else None, timeout_s=timeout,
                                      device=device, jobs=jobs, partial=_writer(json_path) if reports else None,
                                      nodes=nodes)  # fmt: skip
    except ConvcheckError as exc:
        click.echo(f"convcheck: error: {exc}", err=True)
        sys.exit(2)
    end_on_other_node(nodes, "pass" if result.passed else "fail", 0 if result.passed else 1)
    print_matrix(result)
    if json_path:
        write_json_atomic(json_path, result.to_dict())
    sys.exit(0 if result.passed else 1)


def _writer(json_path: str | None) -> Any:
    """Rewrites the JSON matrix after each fixture x layout (`"verdict": "incomplete"` until the end), so a run cut
    short still leaves what it proved."""
    if not json_path:
        return None

    return lambda partial: write_json_atomic(json_path, partial.to_dict())


def _versions_line() -> str:
    v = versions()
    return ", ".join(f"{k} {v[k]}" for k in ("megatron-core", "megatron-bridge", "transformers", "torch"))


def print_matrix(result: Any, console: Any = None) -> None:
    """The kill matrix (mutant x oracle), each mutant's first finding, the clean runs and a summary line."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    grid = Table(title=f"kill matrix ({'quick' if result.quick else 'full'})")
    grid.add_column("mutant", overflow="fold")
    grid.add_column("fixture / layout", overflow="fold")
    for oracle in result.oracles:
        grid.add_column(oracle)
    for row in result.rows:
        m = row.mutant
        where = (f"{m.fixture} {row.layout}" + ("" if m.experts == "sequential" else f" {m.experts}")
                 + ("" if m.spec == "local" else f" {m.spec}"))  # fmt: skip
        cells = [
            _MARK.get(c, c) + ("*" if o in row.mutant.catches and c != "caught" else "")
            for o, c in ((o, row.cells.get(o, "n/a")) for o in result.oracles)
        ]
        name = row.mutant.name if row.killed else f"[bold red]{row.mutant.name}[/bold red]"
        grid.add_row(name, where, *cells)
    console.print(grid)
    console.print("[dim]* an oracle the catalog expects to catch it[/dim]", highlight=False)
    for row in result.rows:
        verdict = _STATUS[row.status]
        line = escape(row.skipped or row.first_finding or "no finding")
        where = f"{row.layout}, {row.device}" if row.device else row.layout
        console.print(f"{verdict} {row.mutant.name} ({where}): {line}", highlight=False, soft_wrap=True)
        if row.expected_missed:
            console.print(f"  [yellow]expected but missed by: {', '.join(row.expected_missed)}[/yellow]",
                          highlight=False)  # fmt: skip
        if row.note:
            console.print(f"  [dim]{escape(row.note)}[/dim]", highlight=False)
    for clean in result.clean:
        word = ("[dim]SKIPPED[/dim]" if clean.skipped else "[green]PASS[/green]" if clean.passed
                else "[bold red]FALSE ALARM[/bold red]")  # fmt: skip
        tail = "" if clean.passed else f": {escape(clean.first_finding or ', '.join(clean.failing))}"
        tail = f": {escape(clean.skipped)}" if clean.skipped else tail
        if clean.upstream_bugs:
            tail += f" (known upstream bugs, not false alarms: {', '.join(clean.upstream_bugs)})"
        on = f" on {clean.device}" if clean.device else ""
        console.print(f"{word} clean {escape(clean.launch.label)} ({','.join(clean.launch.oracles)}){on}{tail}",
                      highlight=False, soft_wrap=True)  # fmt: skip
    ran = [r for r in result.rows if r.status != "skipped"]
    killed = sum(r.status == "killed" for r in ran)
    errored = sum(r.status == "errored" for r in ran)
    weaker = sum(bool(r.expected_missed) for r in result.rows)
    clean_ran = [c for c in result.clean if not c.skipped]
    devices = sorted({r.device for r in [*ran, *clean_ran] if r.device})
    word = "[bold green]PASS[/bold green]" if result.passed else "[bold red]FAIL[/bold red]"
    console.print(
        f"{word} selftest: {killed}/{len(ran)} mutants killed"
        + (f", {errored} errored (an error is never a kill)" if errored else "")
        + f", {sum(c.passed for c in clean_ran)}/{len(clean_ran)} clean runs pass"
        + (f", {weaker} with an expected oracle missing" if weaker else "")
        + (
            f"; {len(result.skipped)} mutant row(s) and {len(result.clean) - len(clean_ran)} clean run(s) skipped "
            "(no engine environment, or too few GPUs for --device cuda: each says why)"
            if len(ran) < len(result.rows)
            else ""
        )
        + f"; ran on {', '.join(devices) or 'nothing'}"
        + f"; {result.launches} launches in {result.seconds:.0f} s ({result.seconds / 60:.1f} min)",
        highlight=False,
    )
