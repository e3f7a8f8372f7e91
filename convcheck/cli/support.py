"""`convcheck support`: a thin click command over convcheck.workflows.support."""

from __future__ import annotations

import json
import shlex
import sys
from importlib import metadata

import click

from convcheck.atomic import write_text_atomic
from convcheck.errors import ConvcheckError
from convcheck.workflows import support as workflow

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


@click.command()
@click.option("--arch", "archs", multiple=True, metavar="NAME", help="Only this HF architecture (repeatable).")
@click.option("--jobs", type=click.IntRange(1, 64), default=1, show_default=True, help="Architectures at once.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the table as JSON.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False), help="Write the table as Markdown.")
@click.option(
    "--merge",
    "merge_path",
    type=click.Path(dir_okay=False, exists=False),
    help="Keep the rows of this earlier --json table for every architecture not named by --arch.",
)
@click.option("--timeout", type=click.IntRange(30, 7200), default=900, show_default=True,
              help="Seconds per verify run (and per checkpoint build).")  # fmt: skip
def support(archs: tuple[str, ...], jobs: int, json_path: str | None, markdown_path: str | None,
            merge_path: str | None, timeout: int) -> None:  # fmt: skip
    """A verdict for every language-model architecture the installed megatron-bridge registers.

    Each gets a tiny checkpoint written by transformers from its class's default config (shrunk), verified at TP2
    (and EP2 with experts) with the default oracles on the CPU; one progress line per architecture on stderr.
    Exit 0 when no row is an untagged FAIL, 1 otherwise, 2 bad input.
    """
    try:
        for path in (json_path, markdown_path):
            if path:
                from convcheck.hf.digest import check_output

                check_output(path)
        kept = workflow.load_rows(merge_path) if merge_path else []
        every = workflow.enumerate_architectures()
        entries = workflow.select(every, archs)
        if kept:  # the named ones run again, every other keeps its earlier row
            kept = [r for r in kept if r.arch not in set(archs)]
            entries = every
        click.echo(f"convcheck support: {len(entries) - len(kept)} architecture(s), {jobs} at a time", err=True)
        rows = workflow.run_support(entries, jobs=jobs, timeout=timeout, kept=kept,
                                    progress=lambda r: click.echo(workflow.progress_line(r), err=True))  # fmt: skip
    except ConvcheckError as exc:
        click.echo(f"convcheck: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    counts = workflow.counts(rows)
    if json_path:
        write_text_atomic(
            json_path, json.dumps({"counts": counts, "rows": [r.to_dict() for r in rows]}, indent=2) + "\n"
        )
    if markdown_path:
        merged = ["--merge", "TABLE.json"] if merge_path else []
        command = shlex.join(["convcheck", "support", *sum((["--arch", a] for a in archs), []), *merged,
                              "--markdown", "docs/support.md"])  # fmt: skip
        versions = {p: metadata.version(p) for p in ("megatron-bridge", "megatron-core", "transformers")}
        write_text_atomic(markdown_path, workflow.markdown(rows, command, versions))
    click.echo(" ".join(f"{k}={v}" for k, v in counts.items()))
    sys.exit(EXIT_FAIL if counts["untagged_fail"] else EXIT_PASS)
