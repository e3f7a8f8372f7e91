"""`convcheck sweep A B` and `convcheck digest SRC`: thin click commands over convcheck.hf.sweep and .digest."""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import click

from convcheck.errors import ConvcheckError
from convcheck.hf.checkpoint import open_weights
from convcheck.hf.digest import HASH, check_output, digest_weights, write_digest, write_text_atomic
from convcheck.hf.sweep import SweepResult, bytes_to_read, compare, open_side

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
MAX_PRINTED = 20
PROGRESS_MIN_BYTES = 300_000_000
"""Inputs reading fewer bytes than this finish too fast for a progress bar to help."""


def _bad_input(exc: BaseException) -> NoReturn:
    click.echo(f"convcheck: error: {exc}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@contextmanager
def _progress(total: int, label: str, quiet: bool) -> Iterator[Callable[[int], None] | None]:
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


def _size(n: int) -> str:
    """Bytes in decimal units: 4.2 kB, 419.4 MB, 2.18 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{n} B"


def _junit_xml(result: SweepResult) -> str:
    """One testsuite with one testcase "sweep"; a failure lists every finding."""
    suite = ET.Element("testsuite", name="convcheck", tests="1", errors="0", time=f"{result.seconds:.3f}")
    suite.set("failures", "0" if result.verdict == "pass" else "1")
    case = ET.SubElement(suite, "testcase", classname="convcheck.hf.sweep", name="sweep", time=f"{result.seconds:.3f}")
    if result.verdict != "pass":
        failure = ET.SubElement(case, "failure", message=f"{len(result.findings)} finding(s)", type="sweep")
        failure.text = "\n".join(f"{f.tensor}: [{f.kind}] {f.message}" for f in result.findings)
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


@click.command()
@click.argument("a")
@click.argument("b")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the report as JSON.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), help="Write JUnit XML.")
@click.option("--quiet", is_flag=True, help="Print only the summary line.")
def sweep(a: str, b: str, json_path: str | None, junit_path: str | None, quiet: bool) -> None:
    """Compare checkpoint B with reference A tensor by tensor, by raw bytes (or digests if one is a manifest).

    A and B: a folder with model.safetensors.index.json or model.safetensors, a .safetensors file, or a manifest
    written by `convcheck digest`. Exit 0 identical, 1 differences found, 2 bad input.
    """
    started = time.perf_counter()
    try:
        targets = [check_output(p) for p in (json_path, junit_path) if p]
        side_a, side_b = open_side(a), open_side(b)
        with _progress(bytes_to_read(side_a, side_b), "sweep", quiet) as progress:
            result = compare(side_a, side_b, progress=progress)
        for target, text in zip(targets, _reports(result, json_path, junit_path), strict=True):
            write_text_atomic(target, text)
    except ConvcheckError as exc:
        _bad_input(exc)
    if not quiet:
        for f in result.findings[:MAX_PRINTED]:
            click.echo(f"FAIL sweep: {f.tensor}: [{f.kind}] {f.message}")
        if len(result.findings) > MAX_PRINTED:
            hint = "" if json_path else " (--json F)"
            click.echo(f"... {len(result.findings) - MAX_PRINTED} more in the JSON report{hint}")
    passed = result.verdict == "pass"
    word = click.style("PASS", fg="green", bold=True) if passed else click.style("FAIL", fg="red", bold=True)
    what = "identical" if passed else f"{len(result.findings)} finding(s)"
    click.echo(
        f"{word} {a} vs {b}: {what}; {result.tensors} tensors in both ({result.a_tensors} in A, {result.b_tensors}"
        f" in B), {result.bytes} bytes ({_size(result.bytes)}) compared, {_size(result.bytes_read)} read,"
        f" {time.perf_counter() - started:.2f} s"
    )
    sys.exit(EXIT_PASS if passed else EXIT_FAIL)


def _reports(result: SweepResult, json_path: str | None, junit_path: str | None) -> list[str]:
    """The texts of the requested reports, in the order (json, junit)."""
    texts = []
    if json_path:
        texts.append(json.dumps(result.to_dict(), indent=2) + "\n")
    if junit_path:
        texts.append(_junit_xml(result))
    return texts


@click.command()
@click.argument("src")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the manifest here (default: standard output).")
def digest(src: str, out: str | None) -> None:
    """Write a digest manifest of SRC: the hash of every tensor's raw stored bytes, with its dtype and shape.

    SRC: a checkpoint folder or a .safetensors file. Compare it later with `convcheck sweep CHECKPOINT MANIFEST`.
    """
    started = time.perf_counter()
    try:
        if out:
            check_output(out)
        if Path(src).suffix == ".json" and Path(src).is_file():
            raise ConvcheckError(f"{src} is a JSON file, not safetensors weights")
        weights = open_weights(src)
        total = sum(e.nbytes for e in weights.tensors.values())
        with _progress(total, "digest", quiet=False) as progress:
            if not out:
                click.echo(digest_weights(weights, HASH, progress).to_json(), nl=False)
                return
            manifest = write_digest(weights, out, progress)
    except ConvcheckError as exc:
        _bad_input(exc)
    click.echo(
        f"wrote {out}: {len(manifest.tensors)} tensors, {total} bytes ({_size(total)}) hashed with {manifest.hash},"
        f" {time.perf_counter() - started:.2f} s"
    )
