"""Compare a case's manifest with its golden one: every difference named, attributed and explained (pure, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS: dict[str, str] = {
    "case-not-run": "the case no longer runs (setup error or bad input at the current versions)",
    "case-not-golden": "the case ran but has no golden manifest",
    "source-changed": "the source checkpoint's bytes differ from the one the golden run read",
    "export-error": "the bridge's export raised (or stopped raising)",
    "tensor-added": "an HF tensor is exported that the golden export lacked",
    "tensor-removed": "an HF tensor of the golden export is no longer exported",
    "tensor-renamed": "the same bytes are exported under a new name",
    "tensor-copies": "a tensor is exported a different number of times",
    "dtype-changed": "an exported tensor has another dtype",
    "shape-changed": "an exported tensor has another shape",
    "bytes-changed": "an exported tensor has other bytes (same dtype and shape)",
    "task-added": "a Megatron parameter the golden run did not convert",
    "task-removed": "a Megatron parameter of the golden run is no longer converted",
    "mapping-changed": "a Megatron parameter is converted by another mapping class (or resolved parallelism)",
    "hf-names-changed": "a Megatron parameter maps to other HF names",
    "config-changed": "a field of the exported HF config differs (added, removed or another value)",
    "verdict-regression": "an oracle that passed now fails",
    "verdict-improved": "an oracle that failed now passes",
    "findings-changed": "a failing oracle fails with other findings",
    "checked-changed": "an oracle checked another number of things",
    "oracle-missing": "an oracle of the golden run gave no verdict",
    "oracle-added": "an oracle the golden run did not have",
}
"""Every kind of difference `compare` reports (what an allow-file entry's `kind` may name)."""
_EXPLAINING = ("roundtrip", "layout", "mapping")
"""Oracles whose finding on a tensor explains its changed bytes (first differing element, diagnosis)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Difference:
    """One difference between the golden and the current manifest of a case."""

    case: str
    kind: str
    subject: str
    """The tensor, Megatron parameter, config field or oracle the difference is about."""
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"case": self.case, "kind": self.kind, "subject": self.subject, "message": self.message}
        if self.detail:
            out["detail"] = self.detail
        return out


def compare(golden: dict[str, Any], current: dict[str, Any]) -> list[Difference]:
    """Every difference between two manifests of one case, in a stable order (sections, then names)."""
    case = str(golden.get("case", {}).get("id") or current.get("case", {}).get("id") or "?")
    out: list[Difference] = []
    if golden["source"] != current["source"]:
        message = (
            f"source checkpoint fingerprint {golden['source']['sha256'][:12]} -> {current['source']['sha256'][:12]} "
            f"({golden['source']['tensors']} -> {current['source']['tensors']} tensors): the fixture itself changed"
        )
        out.append(Difference(case=case, kind="source-changed", subject="<source>", message=message))
    out += _export(case, golden["export"], current["export"], current.get("oracles", {}))
    out += _tasks(case, golden["tasks"], current["tasks"])
    out += _config(case, golden["config"], current["config"])
    out += _oracles(case, golden["oracles"], current["oracles"])
    return out


def not_run(case: str, error: str) -> Difference:
    """The difference of a golden case that could not run now."""
    return Difference(case=case, kind="case-not-run", subject="<case>", message=f"the case no longer runs: {error}")


def not_golden(case: str) -> Difference:
    """The difference of a case that ran without a golden manifest to compare with."""
    return Difference(case=case, kind="case-not-golden", subject="<case>", message="no golden manifest for this case")


def _brief(entry: dict[str, Any]) -> str:
    return f"{entry['dtype']} {entry['shape']} sha256 {entry['sha256'][:12]}"


def _bytes_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """(dtype, shape, sha256) of a manifest entry, hashable: equal keys mean the same bytes."""
    shape = entry.get("shape")
    return entry.get("dtype"), tuple(shape) if isinstance(shape, list) else shape, entry.get("sha256")


def renamed(removed: list[str], added: list[str], old: dict[str, Any], new: dict[str, Any]) -> dict[str, str]:
    """Each removed name (in order) paired with the first still-unpaired added name holding the same bytes; one
    dict lookup per name, so a release that renames every tensor costs linear time."""
    by_key: dict[tuple[Any, ...], list[str]] = {}
    for name in reversed(added):
        by_key.setdefault(_bytes_key(new[name]), []).append(name)  # reversed: pop() gives the first
    out = {}
    for name in removed:
        bucket = by_key.get(_bytes_key(old[name]))
        if bucket:
            out[name] = bucket.pop()
    return out


def _export(case: str, golden: dict[str, Any], current: dict[str, Any], oracles: dict[str, Any]) -> list[Difference]:
    out = []
    if golden.get("error") != current.get("error"):
        message = f"export error {golden.get('error')!r} -> {current.get('error')!r}"
        out.append(Difference(case=case, kind="export-error", subject="<export>", message=message))
    old, new = golden["tensors"], current["tensors"]
    removed = sorted(set(old) - set(new))
    added = sorted(set(new) - set(old))
    twins = renamed(removed, added, old, new)
    for name, twin in twins.items():
        message = f"renamed to {twin} (same bytes: {_brief(old[name])})"
        out.append(Difference(case=case, kind="tensor-renamed", subject=name, message=message, detail={"to": twin}))
    taken = set(twins.values())
    removed = [n for n in removed if n not in twins]
    added = [n for n in added if n not in taken]
    for name in removed:
        message = f"no longer exported (golden: {_brief(old[name])})"
        out.append(Difference(case=case, kind="tensor-removed", subject=name, message=message))
    for name in added:
        message = f"newly exported: {_brief(new[name])}" + _why(name, new[name], oracles)
        out.append(Difference(case=case, kind="tensor-added", subject=name, message=message))
    for name in sorted(set(old) & set(new)):
        out += _tensor(case, name, old[name], new[name], oracles)
    return out


def _tensor(
    case: str, name: str, old: dict[str, Any], new: dict[str, Any], oracles: dict[str, Any]
) -> list[Difference]:
    out = []
    if old.get("copies", 1) != new.get("copies", 1):
        message = f"exported {new.get('copies', 1)} time(s), golden {old.get('copies', 1)}"
        out.append(Difference(case=case, kind="tensor-copies", subject=name, message=message))
    detail = {"golden": _brief(old), "current": _brief(new)}
    if old["dtype"] != new["dtype"]:
        message = f"dtype {old['dtype']} -> {new['dtype']}" + _why(name, new, oracles)
        out.append(Difference(case=case, kind="dtype-changed", subject=name, message=message, detail=detail))
    elif old["shape"] != new["shape"]:
        message = f"shape {old['shape']} -> {new['shape']}" + _why(name, new, oracles)
        out.append(Difference(case=case, kind="shape-changed", subject=name, message=message, detail=detail))
    elif old["sha256"] != new["sha256"]:
        message = f"bytes changed: sha256 {old['sha256'][:12]} -> {new['sha256'][:12]}" + _why(name, new, oracles)
        out.append(Difference(case=case, kind="bytes-changed", subject=name, message=message, detail=detail))
    return out


def _why(name: str, entry: dict[str, Any], oracles: dict[str, Any]) -> str:
    """What the current run's oracles say about this tensor (first differing element, diagnosis), or the source."""
    for oracle in _EXPLAINING:
        for f in oracles.get(oracle, {}).get("findings", []):
            if f["tensor"] == name:
                return f"; {oracle} now: [{f['kind']}] {f['message']}"
    if "equals_source" not in entry:
        return "; not a tensor of the source checkpoint"
    if entry["equals_source"]:
        return "; now equal to the source tensor (the golden export differed from the source)"
    return "; differs from the source tensor"


def _tasks(case: str, golden: dict[str, Any], current: dict[str, Any]) -> list[Difference]:
    out = []
    for name in sorted(set(golden) | set(current)):
        old, new = golden.get(name), current.get(name)
        if old is None:
            message = f"newly converted by {new['mapping']} -> {new['hf']}"
            out.append(Difference(case=case, kind="task-added", subject=name, message=message))
        elif new is None:
            message = f"no longer a parameter of the model (golden: {old['mapping']} -> {old['hf']})"
            out.append(Difference(case=case, kind="task-removed", subject=name, message=message))
        else:
            if (old["mapping"], old.get("resolved")) != (new["mapping"], new.get("resolved")):
                message = f"mapping {_mapping(old)} -> {_mapping(new)}"
                out.append(Difference(case=case, kind="mapping-changed", subject=name, message=message))
            if old["hf"] != new["hf"]:
                message = f"HF names {old['hf']} -> {new['hf']}"
                out.append(Difference(case=case, kind="hf-names-changed", subject=name, message=message))
    return out


def _mapping(entry: dict[str, Any]) -> str:
    return str(entry["mapping"]) + (f" ({entry['resolved']})" if entry.get("resolved") else "")


_ABSENT = object()


def _config(case: str, golden: dict[str, Any], current: dict[str, Any]) -> list[Difference]:
    out = []
    for key in sorted(set(golden) | set(current)):
        old, new = golden.get(key, _ABSENT), current.get(key, _ABSENT)
        if old == new and type(old) is type(new):
            continue
        shown_old = "absent" if old is _ABSENT else repr(old)
        shown_new = "absent" if new is _ABSENT else repr(new)
        detail = {"golden": None if old is _ABSENT else old, "current": None if new is _ABSENT else new}
        message = f"exported config {key}: {shown_old} -> {shown_new}"
        out.append(Difference(case=case, kind="config-changed", subject=key, message=message, detail=detail))
    return out


def _findings(record: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["kind"], f["tensor"]) for f in record.get("findings", [])}


def _shown(findings: list[dict[str, Any]], limit: int = 3) -> str:
    parts = [f"{f['tensor']} [{f['kind']}] {f['message']}" for f in findings[:limit]]
    more = f" (+{len(findings) - limit} more)" if len(findings) > limit else ""
    return "; ".join(parts) + more


def _oracles(case: str, golden: dict[str, Any], current: dict[str, Any]) -> list[Difference]:
    out = []
    for name in sorted(set(golden) | set(current)):
        old, new = golden.get(name), current.get(name)
        if new is None:
            message = f"the golden run had a {old['verdict']} verdict; the current run has none"
            out.append(Difference(case=case, kind="oracle-missing", subject=name, message=message))
            continue
        if old is None:
            message = f"not in the golden run; now {new['verdict']}"
            out.append(Difference(case=case, kind="oracle-added", subject=name, message=message))
            continue
        if old["verdict"] == "pass" and new["verdict"] != "pass":
            findings = new.get("findings", [])
            message = f"passed, now fails with {len(findings)} finding(s): {_shown(findings)}"
            detail = {"findings": [[f["kind"], f["tensor"]] for f in findings]}
            out.append(Difference(case=case, kind="verdict-regression", subject=name, message=message, detail=detail))
        elif old["verdict"] != "pass" and new["verdict"] == "pass":
            message = f"failed with {len(old.get('findings', []))} finding(s), now passes"
            out.append(Difference(case=case, kind="verdict-improved", subject=name, message=message))
        elif _findings(old) != _findings(new):
            gone, came = sorted(_findings(old) - _findings(new)), sorted(_findings(new) - _findings(old))
            message = f"findings changed: {len(came)} new, {len(gone)} gone" + (
                f"; first new: {came[0][1]} [{came[0][0]}]" if came else ""
            )
            detail = {"new": [list(x) for x in came], "gone": [list(x) for x in gone]}
            out.append(Difference(case=case, kind="findings-changed", subject=name, message=message, detail=detail))
        if old["checked"] != new["checked"]:
            message = f"checked {old['checked']} -> {new['checked']} {new.get('unit', '')}".rstrip()
            out.append(Difference(case=case, kind="checked-changed", subject=name, message=message))
    return out
