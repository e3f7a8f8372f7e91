"""Render a Report: a rich table for people, JSON and JUnit XML for machines."""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from convcheck.atomic import write_text_atomic
from convcheck.verdict import PASS, Report


def print_report(report: Report, table: str = "all", console: Any = None, max_findings: int = 20) -> None:
    """Per-tensor table (one column per oracle), the findings, a line per oracle and a summary line."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    if table != "none":
        for title, names, rows in _tables(report):
            if table == "failures":
                names = [n for n in names if any(r.verdict != PASS for r in rows[n].values())]
            if names:
                console.print(_grid(f"{title}: {report.model}  {_layout_label(report.layout)}  ({report.device})",
                                    names, rows, [o.name for o in report.oracles]))  # fmt: skip
    for oracle in report.oracles:
        for f in oracle.findings[:max_findings]:
            console.print(
                f"[red]FAIL[/red] {oracle.name}: {escape(f.tensor)}: {escape(f'[{f.kind}]')} {escape(f.message)}",
                highlight=False,
                soft_wrap=True,
            )
        if len(oracle.findings) > max_findings:
            console.print(
                f"  ... {len(oracle.findings) - max_findings} more {oracle.name} finding(s) in the JSON report"
            )
    for oracle in report.oracles:
        console.print(
            f"{_styled(oracle.verdict)} {oracle.name}: checked {oracle.checked} {oracle.unit}, "
            f"{len(oracle.findings)} finding(s), {oracle.seconds:.1f} s{_metrics_text(oracle.metrics)}",
            highlight=False,
        )
    word = "PASS" if report.verdict == PASS else "FAIL"
    color = "green" if report.verdict == PASS else "red"
    console.print(
        f"[bold {color}]{word}[/bold {color}] {report.model} {_layout_label(report.layout)} on {report.device}: "
        f"{sum(o.verdict == PASS for o in report.oracles)}/{len(report.oracles)} oracles pass ({report.seconds:.1f} s)",
        highlight=False,
    )


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


def _grid(title: str, names: list[str], rows: dict[str, dict[str, Any]], order: list[str]) -> Any:
    """One rich table: tensor, shape, dtype, then a verdict column per oracle that has rows here."""
    from rich.markup import escape
    from rich.table import Table

    columns = [o for o in order if any(o in rows[n] for n in names)]
    grid = Table(title=title)
    grid.add_column("tensor", overflow="fold")
    grid.add_column("shape")
    grid.add_column("dtype")
    for column in columns:
        grid.add_column(column)
    for name in names:
        cells = [rows[name].get(c) for c in columns]
        known = [c for c in cells if c is not None and c.shape]
        shape = "x".join(map(str, known[0].shape)) if known else "-"
        dtype = next((c.dtype for c in cells if c is not None and c.dtype not in ("", "?")), "-")
        grid.add_row(escape(name), shape, dtype, *[_styled(c.verdict) if c else "-" for c in cells])
    return grid


def _styled(verdict: str) -> str:
    return {"pass": "[green]PASS[/green]", "fail": "[red]FAIL[/red]"}.get(
        verdict, f"[yellow]{verdict.upper()}[/yellow]"
    )


def _layout_label(layout: dict[str, int]) -> str:
    parts = [f"{k.upper()}{layout[k]}" for k in ("tp", "pp", "ep", "etp") if layout.get(k, 1) > 1]
    return "x".join(parts) or "TP1"


def write_json(report: Report, path: str | os.PathLike[str]) -> None:
    """The report as JSON (see README for the schema)."""
    write_text_atomic(path, json.dumps(report.to_dict(), indent=2) + "\n")


def junit_xml(report: Report) -> str:
    """JUnit XML: one testsuite per run, one testcase per oracle, findings in the failure text."""
    label = f"{report.model}.{_layout_label(report.layout)}"
    failures = sum(o.verdict != PASS for o in report.oracles)
    suite = ET.Element(
        "testsuite",
        name="convcheck",
        tests=str(len(report.oracles)),
        failures=str(failures),
        errors="0",
        time=f"{report.seconds:.3f}",
    )
    for oracle in report.oracles:
        case = ET.SubElement(suite, "testcase", classname=label, name=oracle.name, time=f"{oracle.seconds:.3f}")
        if oracle.verdict != PASS:
            lines = [f"{f.tensor}: [{f.kind}] {f.message}" for f in oracle.findings] or [
                f"checked {oracle.checked} {oracle.unit}: nothing was checked"
            ]
            failure = ET.SubElement(case, "failure", message=f"{len(oracle.findings)} finding(s)", type=oracle.name)
            failure.text = "\n".join(lines)
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(report: Report, path: str | os.PathLike[str]) -> None:
    write_text_atomic(path, junit_xml(report))
