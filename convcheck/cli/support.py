"""`convcheck support`: a thin click command over convcheck.workflows.support."""

from __future__ import annotations

import shlex
import sys
from importlib import metadata
from pathlib import Path

import click

from convcheck.atomic import write_text_atomic
from convcheck.errors import BadInput, ConvcheckError
from convcheck.workflows import support as workflow

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


@click.command()
@click.option("--arch", "archs", multiple=True, metavar="NAME", help="Only this HF architecture (repeatable).")
@click.option("--jobs", type=click.IntRange(1, 64), default=1, show_default=True, help="Architectures at once.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the table as JSON (rewritten after every architecture).")  # fmt: skip
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False), help="Write the table as Markdown.")
@click.option("--resume", "resume_paths", type=click.Path(dir_okay=False), multiple=True,
              help="Keep the rows of this earlier (or cut short) --json table, not run again (repeatable: a later "
              "table's row wins).")  # fmt: skip
@click.option("--rerun", "reruns", multiple=True, metavar="NAME",
              help="With --resume: run this architecture again all the same (repeatable).")  # fmt: skip
@click.option("--retag", "retag_release", metavar="RELEASE",
              help="Run nothing: re-tag the one --resume table, run on this megatron-bridge release, with this "
              "checkout's known bugs (its recorded findings; verdicts as run).")  # fmt: skip
@click.option("--timeout", type=click.IntRange(30, 7200), default=900, show_default=True,
              help="Seconds per verify run (and per checkpoint build).")  # fmt: skip
def support(archs: tuple[str, ...], jobs: int, json_path: str | None, markdown_path: str | None,
            resume_paths: tuple[str, ...], reruns: tuple[str, ...], retag_release: str | None,
            timeout: int) -> None:  # fmt: skip
    """A verdict for every language-model architecture the installed megatron-bridge registers.

    Each gets a tiny checkpoint written by transformers from its class's default config (shrunk), verified at TP2
    (and EP2 with experts) with the default oracles on the CPU; one progress line per architecture on stderr.
    Exit 0 when no row is an untagged FAIL, 1 otherwise, 2 bad input.
    """
    try:
        from convcheck.hf.digest import check_output

        for path in (json_path, markdown_path):
            if path:
                check_output(path)
        if reruns and not resume_paths:
            raise BadInput("--rerun needs --resume (the table whose rows it replaces)")
        if retag_release:
            _retag(retag_release, resume_paths, json_path, markdown_path, bool(archs or reruns))
        earlier = {r.arch: r for path in resume_paths for r in workflow.load_rows(path)}
        kept = [r for r in earlier.values() if r.arch not in reruns]
        registered = workflow.enumerate_architectures()
        entries = workflow.select(registered, archs)
        workflow.select(entries, reruns)  # a --rerun must be one of the selected architectures
        todo = len({e["arch"] for e in entries if "not_covered" not in e} - {r.arch for r in kept})
        click.echo(f"convcheck support: {len(entries)} architecture(s), {todo} to run, {jobs} at a time", err=True)

        def saved(rows: list[workflow.Row]) -> None:
            if json_path:
                write_text_atomic(json_path, workflow.table_json(rows, complete=len(rows) == len(entries)))

        rows = workflow.run_support(entries, jobs=jobs, timeout=timeout, kept=kept, saved=saved,
                                    progress=lambda r: click.echo(workflow.progress_line(r), err=True))  # fmt: skip
    except ConvcheckError as exc:
        click.echo(f"convcheck: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    _finish(rows, markdown_path, resume_paths, archs, entries, registered, None)


def _retag(release: str, resume_paths: tuple[str, ...], json_path: str | None, markdown_path: str | None,
           selected: bool) -> None:  # fmt: skip
    """`--retag`: the one --resume table re-tagged for `release`, written and counted; exits."""
    from convcheck.gate.release_table import get_release
    from convcheck.workflows.support_retag import retag

    if len(resume_paths) != 1 or selected:
        raise BadInput("--retag takes exactly one --resume table and no --arch / --rerun")
    rows = retag(workflow.load_rows(resume_paths[0]), release)
    if json_path:
        write_text_atomic(json_path, workflow.table_json(rows, complete=True))
    r = get_release(release)
    versions = {"megatron-bridge": r.bridge, "megatron-core": r.megatron_core, "transformers": r.transformers}
    _finish(rows, markdown_path, resume_paths, (), [], [], (release, versions))


def _finish(rows: list[workflow.Row], markdown_path: str | None, resume_paths: tuple[str, ...],
            archs: tuple[str, ...], entries: list[dict], registered: list[dict],
            retagged: tuple[str, dict[str, str]] | None) -> None:  # fmt: skip
    """Write the Markdown table, print the counts, exit 1 when a row is an untagged FAIL."""
    counts = workflow.counts(rows)
    if markdown_path and retagged:
        command = shlex.join(["convcheck", "support", "--resume", Path(resume_paths[0]).name, "--retag", retagged[0],
                              "--markdown", Path(markdown_path).name])  # fmt: skip
        write_text_atomic(markdown_path, workflow.markdown(rows, command, retagged[1]))
    elif markdown_path:
        resumed = sum((["--resume", Path(p).name] for p in resume_paths), [])
        every = {e["arch"] for e in entries} == {e["arch"] for e in registered}
        named = [] if every else sum((["--arch", a] for a in archs), [])  # every registered one: no list
        command = shlex.join(["convcheck", "support", *named, *resumed, "--markdown", "docs/support.md"])
        versions = {p: metadata.version(p) for p in ("megatron-bridge", "megatron-core", "transformers")}
        write_text_atomic(markdown_path, workflow.markdown(rows, command, versions))
    click.echo(" ".join(f"{k}={v}" for k, v in counts.items()))
    sys.exit(EXIT_FAIL if counts["untagged_fail"] else EXIT_PASS)
