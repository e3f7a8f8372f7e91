"""`python -m convcheck.hf.sweep_command A B [--json F] [--junit F] [--quiet]`: the comparison behind `convcheck sweep`
(it reads tensors with numpy and torch, so the CLI runs it in this child process)."""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET

import click

from convcheck.errors import ConvcheckError
from convcheck.hf.console import EXIT_FAIL, EXIT_PASS, bad_input, progress_bar, size_text
from convcheck.hf.digest import check_output, write_text_atomic
from convcheck.hf.sweep import SweepResult, bytes_to_read, compare, open_side

MAX_PRINTED = 20


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


@click.command(name="sweep")
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
        with progress_bar(bytes_to_read(side_a, side_b), "sweep", quiet) as progress:
            result = compare(side_a, side_b, progress=progress)
        for target, text in zip(targets, _reports(result, json_path, junit_path), strict=True):
            write_text_atomic(target, text)
    except ConvcheckError as exc:
        bad_input(exc)
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
        f" in B), {result.bytes} bytes ({size_text(result.bytes)}) compared, {size_text(result.bytes_read)} read,"
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


if __name__ == "__main__":
    sweep()
