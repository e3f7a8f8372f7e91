"""`convcheck gate record` and `convcheck gate check`: golden manifests of a case matrix, compared on an upgrade."""

from __future__ import annotations

import re
import shlex
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import click

from convcheck.atomic import write_all_atomic as write_together
from convcheck.cli.nodes import end_on_other_node, node_options, nodes_of
from convcheck.cli.types import HookSpecType, ReportPath
from convcheck.errors import BadInput, ConvcheckError
from convcheck.fixtures import FIXTURES, QUANT_FIXTURES, RELEASE_VARIANTS, get_spec
from convcheck.gate import GOLDEN_DIR
from convcheck.gate.allow import load_allow, triage
from convcheck.gate.case import Case, default_matrix, fixture_layouts, normalise_model, select
from convcheck.hf.checkpoint import open_checkpoint
from convcheck.layout import ParallelLayout
from convcheck.versions import versions
from convcheck.workflows.candidate_env import candidate_info, candidate_line
from convcheck.workflows.gate_runner import Options, read_index
from convcheck.workflows.gate_runner import check as run_check
from convcheck.workflows.gate_runner import record as run_record

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
_NUMBER = re.compile(r"\d+")


def _bad_input(exc: BaseException) -> NoReturn:
    click.echo(f"convcheck: error: {exc}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _note(line: str) -> None:
    click.echo(line, err=True)


GATE_EPILOG = """\b
Exit codes (check):
  0    every case matches its golden manifest (or differs only as the allow file says)
  1    a difference that the allow file does not list (each is named: tensor, mapping, config field, verdict)
  2    bad input (missing folder or index, unknown case, malformed allow file); one line on stderr
"""


@click.group(epilog=GATE_EPILOG)
def gate() -> None:
    """Gate a Megatron-Bridge upgrade: record golden manifests, then check the installed versions against them."""


def _selection(function: Any) -> Any:
    for option in reversed(
        (
            click.option("--model", "models", multiple=True, help="Only this model (tiny:NAME or NAME; repeatable)."),
            click.option("--layout", "layouts", multiple=True, help="Only this layout, e.g. tp2, tp2ep2 (repeatable)."),
            click.option("--case", "case_ids", multiple=True, help="Only this case id, e.g. qwen3/tp2 (repeatable)."),
            click.option(
                "--device",
                type=click.Choice(["auto", "cpu", "cuda"]),
                default="auto",
                show_default=True,
                envvar="CONVCHECK_DEVICE",
                help="Device of every case (as for verify).",
            ),  # fmt: skip
            click.option(
                "--timeout",
                type=click.FloatRange(min=1),
                default=600.0,
                show_default=True,
                help="Seconds per case before hung ranks are stopped.",
            ),  # fmt: skip
        )
    ):
        function = option(function)
    return function


@gate.command(name="record")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder for the manifests and index.json.")
@_selection
@click.option("--pad-vocab", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --model/--layout: record the padded-vocabulary variant of each case.")  # fmt: skip
@node_options
def record(
    out: str,
    models: tuple[str, ...],
    layouts: tuple[str, ...],
    case_ids: tuple[str, ...],
    device: str,
    timeout: float,
    pad_vocab: int | None,
    **node_params: Any,
) -> None:
    """Run the case matrix (default: every fixture at every legal layout) and write one manifest per case
    (with --nnodes, node 0 writes them; the other nodes write nothing)."""
    try:
        nodes = nodes_of(node_params)
        cases = _record_cases(models, layouts, case_ids, pad_vocab)
        started = time.perf_counter()
        options = Options(device=device, timeout_s=timeout, nodes=nodes)
        results = run_record(cases, Path(out), options, note=_note if options.writes else None)
    except ConvcheckError as exc:
        _bad_input(exc)
    failed = [r for r in results if r.error is not None]
    end_on_other_node(nodes, "fail" if failed else "pass", EXIT_FAIL if failed else EXIT_PASS)
    for r in failed:
        click.echo(f"FAIL {r.case.id}: not recorded: {r.error}")
    done = len(results) - len(failed)
    click.echo(f"{'PASS' if not failed else 'FAIL'} gate record: {done}/{len(results)} case(s) recorded in {out} "
               f"({time.perf_counter() - started:.1f} s)")  # fmt: skip
    sys.exit(EXIT_PASS if not failed else EXIT_FAIL)


def _record_cases(
    models: tuple[str, ...], layouts: tuple[str, ...], case_ids: tuple[str, ...], pad_vocab: int | None
) -> list[Any]:
    """The default matrix (filtered by --case), or every --model at every --layout (illegal pairs: bad input)."""
    if pad_vocab is not None and not (models or layouts):
        raise BadInput("--pad-vocab needs --model and/or --layout (the default matrix has its own padded case)")
    if case_ids and (models or layouts):
        raise BadInput("give either --case or --model/--layout, not both")
    if not models and not layouts:
        return select(default_matrix(), ids=case_ids) if case_ids else default_matrix()
    cases = []
    for model in [normalise_model(m) for m in models] or [
        f"tiny:{n}" for n in sorted(FIXTURES) if n not in (*RELEASE_VARIANTS, *QUANT_FIXTURES)
    ]:
        tiny = model.startswith("tiny:")
        config = get_spec(model).config if tiny else open_checkpoint(model).config
        for text in layouts or (fixture_layouts(model) if tiny else ("tp1", "tp2", "pp2", "ep2", "tp2ep2")):
            layout = ParallelLayout.parse(text)
            try:
                layout.validate_for(config)
            except BadInput:
                if models and layouts:
                    raise
                continue
            cases.append(Case(model=model, layout=layout, pad_vocab=pad_vocab))
    if not cases:
        raise BadInput(f"no legal case for {', '.join([*models, *layouts])}")
    return cases


@gate.command(name="check", epilog=GATE_EPILOG)
@click.argument("folder", required=False, type=click.Path(file_okay=False))
@click.option("--allow", "allow_file", type=click.Path(dir_okay=False),
              help="Reviewed expected differences (JSON or .toml; each entry: kind, reason, optional case, "
              "subject).")  # fmt: skip
@_selection
@click.option("--hook", "hooks", type=HookSpecType(), multiple=True,
              help="Callable run in every rank of every case before the model is built "
              "(planted-bug tests).")  # fmt: skip
@click.option("--json", "json_path", type=ReportPath(), help="Write the gate result as JSON.")
@click.option("--junit", "junit_path", type=ReportPath(), help="Write JUnit XML (one testcase per case).")
@node_options
def check(
    folder: str | None,
    allow_file: str | None,
    models: tuple[str, ...],
    layouts: tuple[str, ...],
    case_ids: tuple[str, ...],
    device: str,
    timeout: float,
    hooks: tuple[str, ...],
    json_path: str | None,
    junit_path: str | None,
    **node_params: Any,
) -> None:
    """Re-run the cases of FOLDER (default: the golden manifests shipped with convcheck) and compare every one
    (with --nnodes, every node compares; node 0 prints the result and writes --json / --junit)."""
    golden = Path(folder) if folder else GOLDEN_DIR
    try:
        nodes = nodes_of(node_params)
        entries = load_allow(allow_file) if allow_file else []
        cases = select(list(read_index(golden).values()), models=models, layouts=layouts, ids=case_ids)
        started = time.perf_counter()
        options = Options(device=device, hooks=hooks, timeout_s=timeout, nodes=nodes)
        allow = {"allow": [e.to_dict() for e in entries]}
        results = run_check(cases, golden, options, note=_note if options.writes else None, agreed=allow)
    except ConvcheckError as exc:
        _bad_input(exc)
    differences = [d for r in results for d in r.differences]
    verdict = triage(differences, entries, [r.case.id for r in results])
    result = gate_result(results, verdict, golden, time.perf_counter() - started)
    end_on_other_node(nodes, result["verdict"], EXIT_PASS if result["verdict"] == "pass" else EXIT_FAIL)
    print_gate(result)
    for case in result["cases"]:
        if case["status"] != "pass":
            click.echo(f"replay: {_replay(folder, case['id'], hooks, allow_file, device)}")

    outputs = {p: render(result) for p, render in ((json_path, _json_text), (junit_path, junit_xml)) if p}
    try:
        write_together(outputs)
    except OSError as exc:
        _bad_input(ConvcheckError(f"cannot write the report: {exc}"))
    sys.exit(EXIT_PASS if result["verdict"] == "pass" else EXIT_FAIL)


def _replay(folder: str | None, case: str, hooks: tuple[str, ...], allow: str | None, device: str) -> str:
    args = ["convcheck", "gate", "check", *([folder] if folder else []), "--case", case]
    for hook in hooks:
        args += ["--hook", hook]
    if allow:
        args += ["--allow", allow]
    if device != "auto":
        args += ["--device", device]
    return shlex.join(args)


def gate_result(results: list[Any], verdict: Any, golden: Path, seconds: float) -> dict[str, Any]:
    """The JSON-ready gate result: per case its status and differences (failing and allowed), unused allow entries."""
    failing = {id(d) for d in verdict.failing}
    allowed = {id(d): e for d, e in verdict.allowed}
    cases = []
    for r in results:
        fails = any(id(d) in failing for d in r.differences)
        status = "pass" if not fails else "not-run" if r.manifest is None else "fail"
        cases.append(
            {
                "id": r.case.id,
                "status": status,
                "seconds": round(r.seconds, 3),
                "golden_versions": _golden_versions(golden, r.case),
                "differences": [d.to_dict() for d in r.differences if id(d) in failing],
                "allowed": [
                    {**d.to_dict(), "reason": allowed[id(d)].reason} for d in r.differences if id(d) in allowed
                ],
            }
        )
    return {
        "verdict": "pass" if all(c["status"] == "pass" for c in cases) else "fail",
        "golden": str(golden),
        "versions": versions(),
        "candidate": candidate_info(),
        "seconds": round(seconds, 3),
        "cases": cases,
        "unused_allow": [{"entry": e.index, **e.to_dict()} for e in verdict.unused],
    }


def _golden_versions(golden: Path, case: Any) -> dict[str, str]:
    import json

    try:
        return json.loads((golden / case.file_name).read_text())["run"]["versions"]
    except (OSError, KeyError, ValueError):
        return {}


def group_differences(differences: Iterable[dict[str, Any]]) -> list[str]:
    """One line per (kind, subject with numbers as #); the cases and names it covers are counted."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in differences:
        groups.setdefault((d["kind"], _NUMBER.sub("#", d["subject"])), []).append(d)
    lines = []
    for (kind, _), members in groups.items():
        first = members[0]
        cases = sorted({m["case"] for m in members})
        names = sorted({m["subject"] for m in members})
        where = (
            first["case"]
            if len(cases) == 1
            else f"{len(cases)} cases ({', '.join(cases[:4])}{', ...' if len(cases) > 4 else ''})"
        )
        subject = first["subject"] if len(names) == 1 else f"{len(names)} names like {first['subject']}"
        lines.append(f"{subject}: [{kind}] {first['message']}  [{where}]")
    return lines


def print_gate(result: dict[str, Any], out: Any = None, max_lines: int = 40) -> None:
    """Grouped differences, allowed and unused allow entries, one line per case, and a PASS/FAIL line."""
    out = out or sys.stdout
    failing = [d for c in result["cases"] for d in c["differences"]]
    lines = [f"FAIL {line}" for line in group_differences(failing)]
    for line in lines[:max_lines]:
        out.write(line + "\n")
    if len(lines) > max_lines:
        out.write(f"  ... {len(lines) - max_lines} more difference line(s) in the JSON result\n")
    allowed = [d for c in result["cases"] for d in c["allowed"]]
    for line in group_differences(allowed):
        out.write(f"ALLOWED {line}\n")
    for e in result["unused_allow"]:
        out.write(f"UNUSED allow entry {e['entry']} ({e['kind']} case={e['case']} subject={e['subject']}): "
                  f"matched no difference in the cases that ran; reason was: {e['reason']}\n")  # fmt: skip
    for c in result["cases"]:
        word = {"pass": "PASS", "fail": "FAIL", "not-run": "FAIL"}[c["status"]]
        extra = f", {len(c['allowed'])} allowed" if c["allowed"] else ""
        out.write(f"{word} {c['id']}: {len(c['differences'])} difference(s){extra} ({c['seconds']:.1f} s)\n")
    passed = sum(c["status"] == "pass" for c in result["cases"])
    if result.get("candidate"):
        out.write(candidate_line(result["candidate"]) + "\n")
    now = result["versions"]
    golden = next((c["golden_versions"] for c in result["cases"] if c["golden_versions"]), {})
    out.write(
        f"{'PASS' if result['verdict'] == 'pass' else 'FAIL'} gate: {passed}/{len(result['cases'])} case(s) match "
        f"{result['golden']} ({result['seconds']:.1f} s); golden: {_stack(golden)}; now: {_stack(now)}\n"
    )
    out.flush()


def _stack(versions: dict[str, str]) -> str:
    keys = ("megatron-core", "megatron-bridge", "transformers", "torch")
    return " ".join(f"{k} {versions[k]}" for k in keys if k in versions) or "unknown"


def _json_text(result: dict[str, Any]) -> str:
    import json

    return json.dumps(result, indent=2) + "\n"


def junit_xml(result: dict[str, Any]) -> str:
    """JUnit XML: one testsuite, one testcase per case; its differences are the failure text."""
    failures = sum(c["status"] != "pass" for c in result["cases"])
    suite = ET.Element("testsuite", name="convcheck-gate", tests=str(len(result["cases"])), failures=str(failures),
                       errors="0", time=f"{result['seconds']:.3f}")  # fmt: skip
    for c in result["cases"]:
        case = ET.SubElement(suite, "testcase", classname="convcheck.gate", name=c["id"], time=f"{c['seconds']:.3f}")
        if c["status"] != "pass":
            failure = ET.SubElement(case, "failure", message=f"{len(c['differences'])} difference(s)", type=c["status"])
            failure.text = "\n".join(f"{d['subject']}: [{d['kind']}] {d['message']}" for d in c["differences"])
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
