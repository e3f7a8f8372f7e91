"""The `convcheck` command line: thin click commands over the library."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from convcheck import api
from convcheck.api import EXPERT_LAYOUTS, LAYER_SPECS
from convcheck.atomic import write_all_atomic as write_together
from convcheck.cache import cache_root, clear_cache
from convcheck.cli.nodes import NODE_OPTIONS, end_on_other_node, node_options, nodes_of
from convcheck.cli.progress import progress_for
from convcheck.cli.render import junit_xml, print_report, report_json
from convcheck.cli.types import HookSpecType, LayoutType, OracleList, ReportPath
from convcheck.engine.launch import Interrupted
from convcheck.engine.place import inside_torchrun
from convcheck.errors import BadInput, ConvcheckError, one_line
from convcheck.fixtures import FIXTURES
from convcheck.fixtures.folders import config_folder, fp8_folder, tiny_folder
from convcheck.layout import ParallelLayout
from convcheck.oracles import OPTIONS, ORACLES, oracles_markdown
from convcheck.sync.adapters import ENGINE_RECEIVER, RECEIVERS, SENDERS
from convcheck.verdict import FAIL, NOT_COVERED, PASS

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_NOT_COVERED = 0, 1, 2, 3


def _fail_line(exc: BaseException) -> None:
    click.echo(f"convcheck: error: {exc}", err=True)
    sys.exit(EXIT_BAD_INPUT)


PREPARE_OPTIONS = ("model", "layers", "tp", "pp", "vpp", "pp_first", "pp_last", "pp_embed", "pp_loss", "ep", "etp",
                   "oracles", "device", "hooks", "experts", "spec", "timeout", "sender", "receiver", "chunk_mb",
                   "pad_vocab", "manifest_path", "resume_layouts", "target_tps", "target_eps", "target_etps",
                   *NODE_OPTIONS, *OPTIONS)  # fmt: skip
"""The verify options that make its Job (the others say where output goes)."""


def cli_layout(p: dict[str, Any]) -> ParallelLayout:
    """The ParallelLayout of verify's --tp --pp --vpp --pp-first --pp-last --pp-embed --pp-loss --ep --etp."""
    return ParallelLayout(**{k: p[k] for k in ("tp", "pp", "vpp", "pp_first", "pp_last", "pp_embed", "pp_loss", "ep",
                                               "etp")})  # fmt: skip


def job_from_options(params: dict[str, Any], progress: Any = None) -> Any:
    """`api.prepare` of verify's parsed options (PREPARE_OPTIONS, as click hands them over) -> the Job."""
    p = params
    return api.prepare(
        p["model"],
        cli_layout(p),
        oracles=p["oracles"],
        device=p["device"],
        hooks=p["hooks"],
        experts=p["experts"],
        spec=p["spec"],
        timeout_s=p["timeout"],
        progress=progress,
        sender=p["sender"],
        receiver=p["receiver"],
        chunk_mb=p["chunk_mb"],
        pad_vocab=p["pad_vocab"],
        manifest_out=p["manifest_path"],
        resume_layout=p["resume_layouts"] or None,
        target_tp=p["target_tps"] or None,
        target_ep=p["target_eps"] or None,
        target_etp=p["target_etps"] or None,
        layers=p["layers"],
        options={key: p[key] for key in OPTIONS},
        nodes=nodes_of(p),
    )


def replay_line(job: Any, oracles: Sequence[str]) -> str:
    """One shell line that reruns exactly `oracles` of this run (built from its Job)."""
    return shlex.join(["convcheck", "verify", *job.replay_args(oracles)])


def oracle_options(command: Any) -> Any:
    """Add every oracle-owned option (convcheck.oracles.OPTIONS, each oracle's OracleInfo.options) to `command`."""
    for key, (oracle, option) in reversed(OPTIONS.items()):
        kind = click.Choice(option.choices) if option.choices else option.kind
        command = click.option(option.flag, key, type=kind, multiple=option.multiple, default=None,
                               metavar=option.metavar, help=f"{oracle} oracle: {option.help}")(command)  # fmt: skip
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="convcheck")
def cli() -> None:
    """Prove Megatron-Core <-> Hugging Face weight conversions correct."""


VERIFY_EPILOG = """\b
Exit codes:
  0    every oracle passed
  1    a verdict failed (the findings name the tensor and first wrong element)
  2    bad input or setup error (one line on stderr; no report written)
  130  interrupted (SIGINT); 143  terminated (SIGTERM): every rank stopped

\b
Examples:
  convcheck verify --model tiny:qwen3-moe --tp 2 --ep 2
  convcheck verify --model /ckpt/qwen3 --tp 2 --oracle coverage,roundtrip --json report.json
  convcheck verify --model config:my-model/config.json --tp 2 --ep 2
  torchrun --nproc-per-node 4 -m convcheck verify --model tiny:qwen3-moe --tp 2 --ep 2
  convcheck verify --model /ckpt/m --tp 2 --ep 4 --etp 2 --nnodes 2 --node-rank $SLURM_NODEID \\
      --master-addr $HEAD --master-port 29400      (one per host: docs/scale.md)
"""


@cli.command(epilog=VERIFY_EPILOG)
@click.option("--model", required=True, help="HF checkpoint folder, a built-in fixture such as tiny:qwen3-moe, or "
              "config:FILE, a config.json shrunk to a tiny random model of its architecture.")  # fmt: skip
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="Decoder layers of a config:FILE model (default: fewest keeping its layer pattern).")  # fmt: skip
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor parallel size.")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline parallel size.")
@click.option("--vpp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Virtual pipeline size: model chunks per pipeline rank, interleaved (needs --pp > 1).")  # fmt: skip
@click.option("--pp-first", type=click.IntRange(min=1), default=None,
              help="Decoder layers of the first pipeline stage (uneven stages; default: even split).")  # fmt: skip
@click.option("--pp-last", type=click.IntRange(min=1), default=None,
              help="Decoder layers of the last pipeline stage (uneven stages; default: even split).")  # fmt: skip
@click.option("--pp-embed", is_flag=True,
              help="Count the embedding as a pipeline layer (the first chunk builds one fewer).")  # fmt: skip
@click.option("--pp-loss", is_flag=True,
              help="Count the loss as a pipeline layer (the last chunk builds one fewer).")  # fmt: skip
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True, help="Expert parallel size.")
@click.option("--etp", type=click.IntRange(min=1), default=1, show_default=True, help="Expert tensor parallel size.")
@click.option(
    "--oracle",
    "oracles",
    type=OracleList(),
    default=None,
    help="Comma-separated oracle names (default: all but opt-in ones).",
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              envvar="CONVCHECK_DEVICE", help="auto: cuda when every rank gets its own visible GPU, else cpu "
              "($CONVCHECK_DEVICE sets the default).")  # fmt: skip
@click.option("--json", "json_path", type=ReportPath(), help="Write the report as JSON.")
@click.option("--junit", "junit_path", type=ReportPath(), help="Write JUnit XML.")
@click.option("--table", type=click.Choice(["all", "failures", "none"]), default="none", show_default=True,
              help="Per-tensor tables (a real model has thousands of rows).")  # fmt: skip
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr (it is shown only on a terminal anyway).")
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds before hung or dead ranks are stopped (exit 2).")  # fmt: skip
@click.option("--log-dir", type=click.Path(file_okay=False), help="Keep the job file and rank logs here.")
@click.option("--hook", "hooks", type=HookSpecType(), multiple=True,
              help="Callable run in every rank before the model is built (extensions, planted-bug tests).")  # fmt: skip
@click.option("--experts", type=click.Choice(EXPERT_LAYOUTS), default="auto", show_default=True,
              help="MoE expert layout: what the bridge's provider asks for (auto: TEGroupedMLP where it sets "
              "moe_grouped_gemm, with --spec te), SequentialMLP, or TEGroupedMLP's linear_fcN.weightE.")  # fmt: skip
@click.option("--spec", type=click.Choice(LAYER_SPECS), default="te", show_default=True,
              help="Layer specs: the Transformer Engine specs production trains with (TE's parameter names, "
              "the bridge's own specs), on convcheck's TE stand-in where TE is missing; or megatron-core's "
              "local spec.")  # fmt: skip
@click.option("--sender", type=HookSpecType("sender", builtins=("bridge", *SENDERS)), default=None,
              help="Weight-sync sender every export consumer reads: bridge (default), bucketed, broadcast, or "
                   "MODULE:FUNC / FILE.py:FUNC called as FUNC(ctx).")  # fmt: skip
@click.option("--receiver", type=HookSpecType("receiver", builtins=(*RECEIVERS, ENGINE_RECEIVER)), default=None,
              help="Receiver of the receiver/idempotence oracles: hf (default), fused, MODULE:CLASS / "
              "FILE.py:CLASS, or vllm (a real vLLM engine, also for the delta oracle; docs/engine.md).")  # fmt: skip
@click.option("--chunk-mb", type=click.FloatRange(min=0, min_open=True), default=64.0, show_default=True,
              help="Bound of one broadcast chunk and of one bucket of the bucketed sender, in MiB.")  # fmt: skip
@click.option("--pad-vocab", type=click.IntRange(min=1), default=None, metavar="N",
              help="Build the padded vocabulary training uses: rows rounded up to a multiple of N x TP.")  # fmt: skip
@click.option("--manifest", "manifest_path", type=ReportPath(),
              help="Write this case's gate manifest (export digests, conversion tasks, config, verdicts).")  # fmt: skip
@click.option("--resume-layout", "resume_layouts", type=LayoutType(), multiple=True,
              help="distckpt oracle: resume its checkpoint at this layout (tp1, tp2ep2, pp2; repeatable; "
              "default tp1).")  # fmt: skip
@click.option("--target-tp", "target_tps", type=click.IntRange(min=1), multiple=True,
              help="reshard oracle: the target TP size (repeatable, all in one launch; default 1).")  # fmt: skip
@click.option("--target-ep", "target_eps", type=click.IntRange(min=1), multiple=True,
              help="reshard oracle: the target expert-parallel size (repeatable; every target TP x EP x ETP "
              "in one launch; default 1).")  # fmt: skip
@click.option("--target-etp", "target_etps", type=click.IntRange(min=1), multiple=True,
              help="reshard oracle: the target expert-TP size, each expert split over it (repeatable; "
              "default 1: experts whole).")  # fmt: skip
@oracle_options
@node_options
def verify(
    model: str,
    layers: int | None,
    tp: int,
    pp: int,
    vpp: int,
    pp_first: int | None,
    pp_last: int | None,
    pp_embed: bool,
    pp_loss: bool,
    ep: int,
    etp: int,
    oracles: tuple[str, ...] | None,
    device: str,
    json_path: str | None,
    junit_path: str | None,
    table: str,
    quiet: bool,
    timeout: float,
    log_dir: str | None,
    hooks: tuple[str, ...],
    experts: str,
    spec: str,
    sender: str | None,
    receiver: str | None,
    chunk_mb: float,
    pad_vocab: int | None,
    manifest_path: str | None,
    resume_layouts: tuple["ParallelLayout", ...],
    target_tps: tuple[int, ...],
    target_eps: tuple[int, ...],
    target_etps: tuple[int, ...],
    nnodes: int,
    node_rank: int | None,
    master_addr: str | None,
    master_port: int | None,
    **oracle_values: Any,
) -> None:
    """Build the sharded Megatron model from MODEL through the real bridge and run the oracles (under torchrun:
    in torchrun's processes, no second launch)."""
    try:
        layout = cli_layout({"tp": tp, "pp": pp, "vpp": vpp, "pp_first": pp_first, "pp_last": pp_last,
                             "pp_embed": pp_embed, "pp_loss": pp_loss, "ep": ep, "etp": etp})  # fmt: skip
    except ConvcheckError as exc:
        _fail_line(exc)
    here = inside_torchrun()
    display = None if here else progress_for(f"{model} {layout.label}", quiet)
    reports = True
    try:
        with display or contextlib.nullcontext():
            options = click.get_current_context().params
            job = job_from_options({k: options[k] for k in PREPARE_OPTIONS}, progress=display)
            if here:
                report, reports = api.run_here(job, log_dir=log_dir)
            else:
                report = api.run(job, log_dir=log_dir, progress=display)
    except ConvcheckError as exc:
        _fail_line(exc)
    code = {PASS: EXIT_PASS, NOT_COVERED: EXIT_NOT_COVERED}.get(report.verdict, EXIT_FAIL)
    if not reports:  # another torchrun process than rank 0: rank 0 prints the report
        sys.exit(code)
    end_on_other_node(job.nodes, report.verdict, code)
    print_report(report, table=table)
    if report.verdict == FAIL:
        failing = [o.name for o in report.oracles if o.verdict == FAIL]
        click.echo("replay: " + replay_line(job, failing))
    outputs = {path: render(report) for path, render in ((json_path, report_json), (junit_path, junit_xml)) if path}
    try:
        write_together(outputs)
    except OSError as exc:
        _fail_line(ConvcheckError(f"cannot write the report: {exc}"))
    sys.exit(code)


@cli.command(name="oracles")
@click.option("--markdown", is_flag=True, help="As the Markdown table README.md embeds.")
def list_oracles(markdown: bool) -> None:
    """List the oracles: what each proves and what it does not."""
    if markdown:
        click.echo(oracles_markdown(), nl=False)
        return
    for info in ORACLES.values():
        opt_in = "" if info.default else f" (not in the default set: --oracle {info.name})"
        click.echo(f"{info.name}{opt_in}\n  proves: {info.proves}\n  does not prove: {info.does_not_prove}")
        if info.live:
            click.echo(f"  live (convcheck.live.check, inside a running job): {info.live}")


@cli.group()
def cache() -> None:
    """What convcheck caches: built fixtures and the layout oracle's TP1 reference manifests."""


@cache.command(name="path")
def cache_path() -> None:
    """Print the cache folder ($CONVCHECK_CACHE_DIR, else $XDG_CACHE_HOME/convcheck, else ~/.cache/convcheck)."""
    click.echo(str(cache_root()))


@cache.command(name="clear")
def cache_clear() -> None:
    """Remove everything convcheck cached (fixtures are rebuilt, references rerun, on next use)."""
    click.echo(f"cleared {clear_cache()}")


@cli.group()
def fixtures() -> None:
    """Tiny deterministic HF checkpoints for tests and demos."""


@fixtures.command(name="list")
def fixtures_list() -> None:
    """List the built-in fixtures."""
    for spec in FIXTURES.values():
        click.echo(f"tiny:{spec.name:<12} {spec.description}")


@fixtures.command(name="build")
@click.argument("name", required=False)
@click.option("--from-config", "config", type=click.Path(dir_okay=False),
              help="Shrink this config.json (no weights) to a tiny random model of its architecture.")  # fmt: skip
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="With --from-config: decoder layers (default: the fewest that keep the layer pattern).")  # fmt: skip
@click.option("--out", type=click.Path(file_okay=False), help="Folder to build into (default: the cache).")
@click.option("--fp8", is_flag=True,
              help="Write the FP8 block checkpoint (float8_e4m3fn weights + weight_scale_inv, fp8-block reference) of "
              "the fixture, with the --from-config file's quantization_config (else a 128 x 128 one): into --out, "
              "else beside the cached bf16 folder (docs/quant.md).")  # fmt: skip
def fixtures_build(name: str | None, config: str | None, layers: int | None, out: str | None, fp8: bool) -> None:
    """Build fixture NAME, or the one shrunk --from-config FILE (or reuse the cached copy); the last line printed is
    its folder; with --from-config, what the shrinker changed goes to stderr first."""
    try:
        if (name is None) == (config is None):
            raise BadInput("give a fixture NAME or --from-config FILE (one of them)")
        if config is None:
            if layers is not None:
                raise BadInput("--layers applies only to --from-config")
            folder, quantization = tiny_folder(name, None if fp8 else out), None
        else:
            folder, notes, quantization = config_folder(config, layers, None if fp8 else out)
            for note in notes:
                click.echo(f"shrunk: {note}", err=True)
        if fp8:
            folder = fp8_folder(folder, Path(out) if out else folder.with_name(folder.name + "-fp8"), quantization)
        click.echo(str(folder))
    except ConvcheckError as exc:
        _fail_line(exc)


def _terminate(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def main() -> None:
    """Console-script entry point: every error is one line on stderr; exit 2 for bad input, 130/143 when cancelled."""
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)  # the launcher hands a caught signal back here once ranks are stopped
    try:
        code = cli.main(standalone_mode=False)
    except Interrupted as exc:
        click.echo(f"convcheck: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):
        click.echo("convcheck: interrupted by SIGINT", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"convcheck: error: {exc.format_message()}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except ConvcheckError as exc:
        _fail_line(exc)
    except Exception as exc:  # noqa: BLE001 - exit 1 means "a verdict failed" and nothing else
        if os.environ.get("CONVCHECK_DEBUG"):  # the traceback, still with exit 2: 1 is only for a failed verdict
            traceback.print_exc()
            sys.exit(EXIT_BAD_INPUT)
        click.echo(
            f"convcheck: error: internal error: {one_line(exc)} (set CONVCHECK_DEBUG=1 for the traceback)", err=True
        )
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(code or 0)
