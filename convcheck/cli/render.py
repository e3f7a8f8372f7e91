"""Render a Report: a summary that fits a terminal for people (tables on request), JSON and JUnit XML for machines."""

from __future__ import annotations

import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any

from convcheck.atomic import write_text_atomic
from convcheck.verdict import FAIL, NOT_COVERED, PASS, Finding, OracleVerdict, Report

_NUMBER = re.compile(r"\d+")


def print_report(report: Report, table: str = "none", out: Any = None, max_findings: int = 20) -> None:
    """Causes, grouped findings, one line per oracle and a PASS/FAIL line (tensor tables only when asked)."""
    out = out or sys.stdout
    styled = _is_terminal(out)
    if table != "none":
        for title, names, rows in _tables(report):
            if table == "failures":
                names = [n for n in names if any(r.verdict != PASS for r in rows[n].values())]
            if names:
                heading = f"{title}: {report.model}  {_layout_label(report.layout)}  ({report.device})"
                _write_lines(out, _grid(heading, names, rows, [o.name for o in report.oracles]))
    for cause in report.causes:
        _write_lines(out, [f"{_word('CAUSE', 'yellow', styled)} {cause}"])
    shared = shared_findings(report.oracles)
    stopping = {
        (f.tensor, f.kind, f.message) for o in report.oracles for f in o.findings if f.detail.get("stopped_run")
    }
    for (tensor, kind, message), names in shared.items():
        where = "stopped" if tensor == "<build>" or (tensor, kind, message) in stopping else "in"
        _write_lines(
            out, [f"{_word('FAIL', 'red', styled)} {tensor}: [{kind}] {message} ({where}: {', '.join(names)})"]
        )
    for oracle in report.oracles:
        own = [f for f in oracle.findings if (f.tensor, f.kind, f.message) not in shared]
        lines = [f"{_word('FAIL', 'red', styled)} {oracle.name}: {text}" for text in group_findings(own)]
        _write_lines(out, lines[:max_findings])
        if len(lines) > max_findings:
            _write_lines(out, [f"  ... {len(lines) - max_findings} more {oracle.name} line(s) in the JSON report"])
    for oracle in report.oracles:
        if oracle.verdict == NOT_COVERED:
            _write_lines(out, [f"{_word('NOT COVERED', 'yellow', styled)} {oracle.name}: {oracle.not_covered}"])
            continue
        word = _word("PASS", "green", styled) if oracle.verdict == PASS else _word("FAIL", "red", styled)
        _write_lines(out, [f"{word} {oracle.name}: {oracle_summary(oracle)}"])
    passed = sum(o.verdict == PASS for o in report.oracles)
    uncovered = [o.name for o in report.oracles if o.verdict == NOT_COVERED]
    word = {PASS: _word("PASS", "bold green", styled), NOT_COVERED: _word("NOT COVERED", "bold yellow", styled)}.get(
        report.verdict, _word("FAIL", "bold red", styled)
    )
    _write_lines(
        out,
        [
            f"{word} {report.model} {_layout_label(report.layout)} on {report.device}: "
            f"{passed}/{len(report.oracles)} oracles pass"
            + (f", {len(uncovered)} not covered by convcheck ({', '.join(uncovered)})" if uncovered else "")
            + f" ({report.seconds:.1f} s)"
            + (f"; device: {report.device_reason}" if report.device_reason else "")
        ],
    )


def shared_findings(oracles: Iterable[OracleVerdict]) -> dict[tuple[str, str, str], list[str]]:
    """(tensor, kind, message) of each finding that several oracles report alike (a build or import failure stops or
    taints every oracle) -> those oracles' names, in run order: printed once, not once per oracle."""
    seen: dict[tuple[str, str, str], list[str]] = {}
    stopping = set()
    for oracle in oracles:
        for f in oracle.findings:
            if f.detail.get("stopped_run"):
                stopping.add((f.tensor, f.kind, f.message))
        for key in dict.fromkeys((f.tensor, f.kind, f.message) for f in oracle.findings):
            seen.setdefault(key, []).append(oracle.name)
    return {k: names for k, names in seen.items() if len(names) > 1 and (k[0] in _STAGES or k in stopping)}


_STAGES = ("<build>", "<import>")
"""The pseudo-tensors of a stage every oracle shares: the model's build and the bridge's import."""


def oracle_summary(oracle: OracleVerdict) -> str:
    """`checked N unit, F finding(s) on T tensor(s), S s; metrics` for one oracle."""
    tensors = len({f.tensor for f in oracle.findings})
    found = f"{len(oracle.findings)} finding(s)" + (f" on {tensors} name(s)" if oracle.findings else "")
    return f"checked {oracle.checked} {oracle.unit}, {found}, {oracle.seconds:.1f} s{_metrics_text(oracle.metrics)}"


def group_findings(findings: Iterable[Finding]) -> list[str]:
    """One line per finding, except that findings of one kind on names differing only in numbers share a line."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.kind, _NUMBER.sub("#", f.tensor)), []).append(f)
    lines = []
    for (kind, _), members in groups.items():
        first = members[0]
        if len(members) == 1:
            lines.append(f"{first.tensor}: [{kind}] {first.message}")
            continue
        lines.append(
            f"{_name_pattern([m.tensor for m in members])}: [{kind}] {len(members)} names, same finding; "
            f"first {first.tensor}: {first.message}"
        )
    return lines


def _name_pattern(names: list[str]) -> str:
    """`model.layers.{0-47}.mlp.experts.{0-127}.w` for names that differ only in their numbers."""
    parts = [_NUMBER.split(n) for n in names]
    numbers = [[int(x) for x in _NUMBER.findall(n)] for n in names]
    out = parts[0][0]
    for i, text in enumerate(parts[0][1:]):
        values = sorted({row[i] for row in numbers})
        out += str(values[0]) if len(values) == 1 else "{" + _ranges(values) + "}"
        out += text
    return out


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    spans: list[list[int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _is_terminal(out: Any) -> bool:
    return bool(getattr(out, "isatty", lambda: False)()) and os.environ.get("NO_COLOR") is None


def _word(word: str, style: str, styled: bool) -> str:
    if not styled:
        return word
    codes = {"red": "31", "green": "32", "yellow": "33", "bold red": "1;31", "bold green": "1;32"}
    return f"\x1b[{codes[style]}m{word}\x1b[0m"


def _write_lines(out: Any, lines: Iterable[str]) -> None:
    """Write whole lines: never hard-wrapped, never padded with trailing spaces."""
    for line in lines:
        out.write(line.rstrip() + "\n")
    out.flush()


def _metrics_text(metrics: dict[str, Any]) -> str:
    """`; key=value ...` for an oracle's measured numbers (floats in 3 significant digits)."""
    if not metrics:
        return ""
    return "; " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


_COUNT = re.compile(r"^(?P<name>.*) \[(?P<n>\d+) elements\]$")
_HF_KEYED = ("coverage", "roundtrip")
"""Oracles whose rows are HF checkpoint tensors; rows of other oracles that name no such tensor are Megatron's."""


def _tables(report: Report) -> list[tuple[str, list[str], dict[str, dict[str, Any]]]]:
    """Rows grouped as (title, sorted names, name -> {oracle: row}): HF tensors first, then Megatron parameters."""
    rows: dict[str, dict[str, Any]] = {}
    for oracle in report.oracles:
        for row in oracle.rows:
            match = _COUNT.match(row.tensor)
            name = match.group("name") if match else row.tensor
            rows.setdefault(name, {})[oracle.name] = row
    hf = {n for n, by in rows.items() if any(o in by for o in _HF_KEYED)}
    if not hf:
        return [("tensors", sorted(rows), rows)]
    megatron = sorted(set(rows) - hf)
    return [("HF tensors", sorted(hf), rows), ("Megatron parameters", megatron, rows)]


def _grid(title: str, names: list[str], rows: dict[str, dict[str, Any]], order: list[str]) -> list[str]:
    """A plain-text table: tensor, shape, dtype, then a verdict column per oracle that has rows here."""
    columns = [o for o in order if any(o in rows[n] for n in names)]
    body = []
    for name in names:
        cells = [rows[name].get(c) for c in columns]
        known = [c for c in cells if c is not None and c.shape]
        shape = "x".join(map(str, known[0].shape)) if known else "-"
        dtype = next((c.dtype for c in cells if c is not None and c.dtype not in ("", "?")), "-")
        body.append([name, shape, dtype, *[c.verdict.upper() if c else "-" for c in cells]])
    header = ["tensor", "shape", "dtype", *columns]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    fmt = [" ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *body]]
    return [title, *fmt, ""]


def _layout_label(layout: dict[str, int]) -> str:
    """The layout's label, with the data-parallel size a live check's job has (`TP2xDP2`)."""
    from convcheck.layout import ParallelLayout

    label = ParallelLayout.from_dict(layout).label
    return f"{label}xDP{layout['dp']}" if layout.get("dp", 1) > 1 else label


def report_json(report: Report) -> str:
    """The report as JSON text (see README for the schema)."""
    return json.dumps(report.to_dict(), indent=2) + "\n"


def write_json(report: Report, path: str | os.PathLike[str]) -> None:
    """The report as JSON (see README for the schema)."""
    write_text_atomic(path, report_json(report))


def junit_xml(report: Report) -> str:
    """JUnit XML: one testsuite per run, one testcase per oracle, findings in the failure text."""
    label = f"{report.model}.{_layout_label(report.layout)}"
    failures = sum(o.verdict == FAIL for o in report.oracles)
    skipped = sum(o.verdict == NOT_COVERED for o in report.oracles)
    suite = ET.Element(
        "testsuite",
        name="convcheck",
        tests=str(len(report.oracles)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{report.seconds:.3f}",
    )
    for oracle in report.oracles:
        case = ET.SubElement(suite, "testcase", classname=label, name=oracle.name, time=f"{oracle.seconds:.3f}")
        if oracle.verdict == NOT_COVERED:
            ET.SubElement(case, "skipped", message=f"not covered: {oracle.not_covered}")
        elif oracle.verdict != PASS:
            lines = [f"{f.tensor}: [{f.kind}] {f.message}" for f in oracle.findings] or [
                f"checked {oracle.checked} {oracle.unit}: nothing was checked"
            ]
            failure = ET.SubElement(case, "failure", message=f"{len(oracle.findings)} finding(s)", type=oracle.name)
            failure.text = "\n".join(lines)
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(report: Report, path: str | os.PathLike[str]) -> None:
    write_text_atomic(path, junit_xml(report))
