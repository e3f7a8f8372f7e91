"""What `convcheck sweep` and `convcheck digest` print: exit codes, the one-line bad-input error, a progress bar on
stderr for large inputs, sizes in decimal units."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import click

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
MAX_PRINTED = 20
PROGRESS_MIN_BYTES = 300_000_000
"""Inputs reading fewer bytes than this finish too fast for a progress bar to help."""


def bad_input(exc: BaseException) -> NoReturn:
    click.echo(f"convcheck: error: {exc}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@contextmanager
def progress_bar(total: int, label: str, quiet: bool) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar on stderr for large inputs when stderr is a terminal; else no callback."""
    if quiet or total < PROGRESS_MIN_BYTES or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(f"[progress.description]{label}", *columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def size_text(n: int) -> str:
    """Bytes in decimal units: 4.2 kB, 419.4 MB, 2.18 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{n} B"
