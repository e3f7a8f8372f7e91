"""The layout oracle's attribution on the launcher side: a multi-rank layout verdict's differences from the source,
told apart by the TP1 export's digest manifest (convcheck.engine.reference launches or reuses it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "layout"
PENDING = "tp1_reference"
"""Metric set by a multi-rank run with differing tensors: the engine attributes them with a TP1 manifest."""
DIFFERS = "differs-from-source"


def pending(verdict: OracleVerdict) -> bool:
    """True when a multi-rank layout verdict waits for its TP1 attribution."""
    return verdict.name == NAME and verdict.metrics.get(PENDING) == "pending"


def attribute(verdict: OracleVerdict, manifest_path: Path, layout_label: str, seconds: float = 0.0) -> OracleVerdict:
    """The layout verdict with each difference from the source attributed by the TP1 manifest: the same bytes at
    TP1 (`tp1-differs-from-source`, not layout-dependent) or other bytes (`layout-differs`)."""
    manifest = json.loads(Path(manifest_path).read_text())
    ref = manifest.get("tensors", {})
    findings: list[Finding] = []
    first = None
    for f in verdict.findings:
        if f.kind == DIFFERS:
            mine = f.detail.get("digest", {})
            theirs = ref.get(f.tensor)
            if theirs is not None and _bare(theirs) == _bare(mine):
                findings.append(retag(f, "tp1-differs-from-source", "the same at TP1: not layout-dependent"))
                continue
            first = first or f.tensor
            at_tp1 = "not in the TP1 export" if theirs is None else f"TP1 exports {_brief(theirs)}"
            layout = digest_cmp(mine, theirs or {})
            findings.append(
                Finding(
                    tensor=f.tensor,
                    kind="layout-differs",
                    message=f"{f.message}; {at_tp1}",
                    detail={**f.detail, "layout": layout},
                )
            )
        elif f.kind == "missing":
            where = "also missing from the TP1 export" if f.tensor not in ref else "the TP1 export has it"
            first = first or (f.tensor if f.tensor in ref else None)
            findings.append(retag(f, f.kind, where))
        else:
            findings.append(f)
    if manifest.get("export_error"):
        message = f"the TP1 export raised {manifest['export_error']}"
        findings.append(Finding(tensor="<export>", kind="tp1-export-failed", message=message))
    if first is not None:
        findings.append(
            Finding(
                tensor="<layout>",
                kind="first-differing",
                message=f"first tensor whose {layout_label} export differs from the TP1 export: {first}",
                detail={"tensor": first},
            )
        )
    metrics = {**verdict.metrics, PENDING: str(manifest_path), "tp1_reference_s": seconds}
    return make_verdict(NAME, verdict.checked, findings, rows=verdict.rows, metrics=metrics, seconds=verdict.seconds)


def retag(f: Finding, kind: str, note: str) -> Finding:
    return Finding(tensor=f.tensor, kind=kind, message=f"{f.message} ({note})", detail=f.detail)


def _bare(d: dict[str, Any]) -> dict[str, Any]:
    """A manifest entry's dtype, shape and digest (what two exports must agree on)."""
    return {k: d[k] for k in ("dtype", "shape", "sha256") if k in d}


def digest_cmp(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Which of dtype / shape / bytes differ."""
    return [k for k in ("dtype", "shape", "sha256") if a.get(k) != b.get(k)]


def _brief(d: dict[str, Any]) -> str:
    return f"{d['dtype']} {d['shape']} sha256 {d['sha256'][:12]}"
