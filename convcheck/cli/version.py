"""`convcheck version write DIR` and `convcheck version check DIR`: click commands over convcheck.workflows.version."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from convcheck.atomic import write_all_atomic as write_together
from convcheck.ckpt.manifest import parse_size
from convcheck.cli.render import group_findings, oracle_summary, report_json
from convcheck.cli.types import HookSpecType, LayoutType, ReportPath
from convcheck.errors import ConvcheckError
from convcheck.verdict import PASS
from convcheck.workflows.version import check_version, write_version

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
MAX_PRINTED = 20

VERSION_EPILOG = """\b
Exit codes:
  0  written / every check passed
  1  the export could not be written as a version / a check failed (the findings name the tensor or file)
  2  bad input or setup error (one line on stderr)
"""


def _bad_input(exc: BaseException) -> NoReturn:
    click.echo(f"convcheck: error: {exc}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ConvcheckError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group()
def version() -> None:
    """Version folders: a Megatron distributed checkpoint and its HF safetensors export, side by side."""


@version.command(name="write", epilog=VERSION_EPILOG)
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--model", required=True, help="HF checkpoint folder, or a built-in fixture such as tiny:qwen3-moe.")
@click.option(
    "--layout", type=LayoutType(), default="tp1", show_default=True, help="Layout to save ckpt/ at (tp2ep2, pp2)."
)
@click.option(
    "--step", type=click.IntRange(min=0), default=None, help="Training step recorded in ckpt/ and the manifest."
)
@click.option(
    "--max-shard-size", default="5GB", show_default=True, help="Largest safetensors shard (a tensor never splits)."
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              envvar="CONVCHECK_DEVICE", help="As for verify.")  # fmt: skip
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True, help="Seconds for the ranks."
)
@click.option("--log-dir", type=click.Path(file_okay=False), help="Keep the job file and rank logs here.")
@click.option("--hook", "hooks", type=HookSpecType(), multiple=True, help="Callable run in every rank first.")
def write(
    folder: str,
    model: str,
    layout: object,
    step: int | None,
    max_shard_size: str,
    device: str,
    timeout: float,
    log_dir: str | None,
    hooks: tuple[str, ...],
) -> None:
    """Write version folder FOLDER from MODEL loaded at --layout: ckpt/ (torch_dist), the HF export, manifest.json."""
    try:
        result = write_version(
            folder, model, layout, step=step, device=device, hooks=hooks, timeout_s=timeout, log_dir=log_dir,
            max_shard_bytes=_size(max_shard_size),
        )  # fmt: skip
    except ConvcheckError as exc:
        _bad_input(exc)
    for f in result.findings[:MAX_PRINTED]:
        click.echo(f"FAIL version write: {f.tensor}: [{f.kind}] {f.message}")
    if result.findings:
        click.echo(f"FAIL {folder}: nothing written, {len(result.findings)} finding(s) ({result.seconds:.1f} s)")
        sys.exit(EXIT_FAIL)
    metrics = result.metrics or {}
    click.echo(
        f"wrote {folder}: {result.tensors} tensors ({result.bytes} bytes) in {result.shards} shard(s), "
        f"ckpt/ torch_dist at {metrics.get('saved_at', '?')} ({metrics.get('sharded_keys', '?')} sharded keys), "
        f"step {step if step is not None else 'not recorded'}, manifest.json ({result.seconds:.1f} s)"
    )
    sys.exit(EXIT_PASS)


@version.command(name="check", epilog=VERSION_EPILOG)
@click.argument("folder", type=click.Path(file_okay=False))
@click.option(
    "--layout", type=LayoutType(), default=None, help="Restore ckpt/ at this layout (default: the manifest's)."
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              envvar="CONVCHECK_DEVICE", help="As for verify.")  # fmt: skip
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True, help="Seconds for the ranks."
)
@click.option("--log-dir", type=click.Path(file_okay=False), help="Keep the job file and rank logs here.")
@click.option("--hook", "hooks", type=HookSpecType(), multiple=True, help="Callable run in every rank first.")
@click.option("--json", "json_path", type=ReportPath(), help="Write the report as JSON.")
def check(
    folder: str,
    layout: object,
    device: str,
    timeout: float,
    log_dir: str | None,
    hooks: tuple[str, ...],
    json_path: str | None,
) -> None:
    """Prove version folder FOLDER: index vs shards, manifest vs bytes, and safetensors == export of ckpt/, bitwise."""
    try:
        report = check_version(folder, layout=layout, device=device, hooks=hooks, timeout_s=timeout, log_dir=log_dir)
    except ConvcheckError as exc:
        _bad_input(exc)
    for verdict in report.oracles:
        lines = group_findings(verdict.findings)
        for line in lines[:MAX_PRINTED]:
            click.echo(f"FAIL {verdict.name}: {line}")
        if len(lines) > MAX_PRINTED:
            click.echo(f"  ... {len(lines) - MAX_PRINTED} more {verdict.name} line(s) in the JSON report")
    for verdict in report.oracles:
        click.echo(f"{'PASS' if verdict.verdict == PASS else 'FAIL'} {verdict.name}: {oracle_summary(verdict)}")
    passed = sum(v.verdict == PASS for v in report.oracles)
    click.echo(
        f"{'PASS' if report.verdict == PASS else 'FAIL'} {folder}: {passed}/{len(report.oracles)} checks pass "
        f"({report.seconds:.1f} s)"
    )
    if json_path:
        try:
            write_together({json_path: report_json(report)})
        except OSError as exc:
            _bad_input(ConvcheckError(f"cannot write the report: {exc}"))
    sys.exit(EXIT_PASS if report.verdict == PASS else EXIT_FAIL)
