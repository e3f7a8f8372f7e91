"""The kill matrix: launches, per-mutant rows and clean rows, and how a launch's findings are credited to its mutants.

Pure data and functions over Reports (no launches): convcheck.workflows.selftest plans and runs the launches.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from convcheck.api import as_oracles
from convcheck.layout import ParallelLayout
from convcheck.models import UPSTREAM_BUG
from convcheck.mutants.catalog import FORWARD, Mutant
from convcheck.oracles import DEFAULT_ORACLES
from convcheck.verdict import PASS, Finding, Report

CAUGHT, MISSED, NOT_APPLICABLE, NOT_RUN, ERROR = "caught", "missed", "n/a", "not run", "error"
CELLS = (CAUGHT, MISSED, NOT_APPLICABLE, NOT_RUN, ERROR)
KILLED, SURVIVED, ERRORED, SKIPPED = "killed", "survived", "errored", "skipped"
"""A mutant row's status: an oracle caught it; it ran and none did; its launch ended in an error (exit 2 in the
CLI: never a kill); this host could not run its launch at the asked device."""

FORWARD_TENSORS = frozenset(
    {
        name + image
        for name in ("logits", "greedy-tokens", "<megatron forward>", "<hf forward>")
        for image in ("", "[image]")
    }
)
"""Finding names of the logits oracle: a target `logits` claims them (they name no tensor), as it claims every
`forward-failed` finding (named by the parameter of the module the forward raised in)."""

Verify = Callable[..., Report]
"""`api.verify`'s signature: (model, layout, *, oracles, hooks, experts) -> Report."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """One verify run: a fixture at one layout, with the hooks of its mutants (none: a clean run)."""

    fixture: str
    layout: str
    """Canonical spelling (ParallelLayout.spec), e.g. "tp2ep2"."""
    experts: str = "sequential"
    spec: str = "local"
    """Layer specs (`--spec`): the gate's and selftest's runs name theirs (local unless a mutant's is te)."""
    mutants: tuple[Mutant, ...] = ()
    oracles: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.fixture, self.layout, self.experts, self.spec)

    @property
    def hooks(self) -> tuple[str, ...]:
        """The `--hook`s of its mutants planted in every rank."""
        return tuple(m.hook for m in self.mutants if m.via == "hook")

    @property
    def sender(self) -> str | None:
        """The `--sender` of a mutant planted in the export stream, if any."""
        return next((m.hook for m in self.mutants if m.via == "sender"), None)

    @property
    def options(self) -> dict[str, str]:
        """The oracle options its mutants set (`engine_receiver` for one planted in the engine process)."""
        out = {k: v for m in self.mutants for k, v in m.options}
        for m in self.mutants:
            if m.via == "engine-receiver":
                out["engine_receiver"] = m.hook
        return out

    @property
    def columns(self) -> tuple[str, ...]:
        """The kill matrix's oracles for its rows: the default ones, then any other it runs (e.g. engine)."""
        return (*DEFAULT_ORACLES, *(o for o in self.oracles if o not in DEFAULT_ORACLES))

    @property
    def label(self) -> str:
        grid = ParallelLayout.parse(self.layout).label
        experts = "" if self.experts == "sequential" else f" --experts {self.experts}"
        spec = "" if self.spec == "local" else f" --spec {self.spec}"
        return f"{self.fixture} {grid}{experts}{spec}"


@dataclass(frozen=True, kw_only=True, slots=True)
class MutantRow:
    """One mutant at one layout: a cell per oracle and the first finding credited to it."""

    mutant: Mutant
    layout: str
    cells: dict[str, str]
    first_finding: str | None = None
    seconds: float = 0.0
    shared_with: tuple[str, ...] = ()
    """The other mutants of its launch."""
    note: str = ""
    device: str = ""
    """Where its launch ran (the report's device), empty when it did not run."""
    skipped: str = ""
    """Why this host did not run it (e.g. `--device cuda` with too few GPUs); empty when it ran."""
    findings: tuple[dict[str, Any], ...] = ()
    """Every finding credited to it: oracle, tensor, kind, first_index (what a CPU and a GPU run must share)."""

    @property
    def killed(self) -> bool:
        return CAUGHT in self.cells.values()

    @property
    def status(self) -> str:
        if self.skipped:
            return SKIPPED
        if ERROR in self.cells.values():
            return ERRORED
        return KILLED if self.killed else SURVIVED

    @property
    def expected_missed(self) -> tuple[str, ...]:
        """Oracles in `catches` that ran and did not catch it."""
        return tuple(o for o in self.mutant.catches if self.cells.get(o) == MISSED)

    def to_dict(self) -> dict[str, Any]:
        m = self.mutant
        return {
            "name": m.name,
            "description": m.description,
            "hook": m.hook,
            "fixture": m.fixture,
            "layout": self.layout,
            "experts": m.experts,
            **({"spec": m.spec} if m.spec != "local" else {}),
            **({"via": m.via} if m.via != "hook" else {}),
            **({"options": dict(m.options)} if m.options else {}),
            "catches": list(m.catches),
            "cells": dict(self.cells),
            "status": self.status,
            "killed": self.killed,
            "device": self.device,
            "expected_missed": list(self.expected_missed),
            "first_finding": self.first_finding,
            "shared_with": list(self.shared_with),
            "seconds": round(self.seconds, 1),
            **({"note": self.note} if self.note else {}),
            **({"skipped": self.skipped} if self.skipped else {}),
            "findings": list(self.findings),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class CleanRow:
    """A run without hooks of one fixture x layout: every oracle must pass (a failure is a false alarm)."""

    launch: Launch
    passed: bool
    failing: tuple[str, ...] = ()
    first_finding: str | None = None
    seconds: float = 0.0
    device: str = ""
    skipped: str = ""
    """Why this host did not run it; empty when it ran."""
    upstream_bugs: tuple[str, ...] = ()
    """Known upstream bugs (megatron-bridge's, vLLM's) whose findings it showed (not false alarms:
    convcheck.models.upstream_bug)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"upstream_bugs": list(self.upstream_bugs)} if self.upstream_bugs else {}),
            "fixture": self.launch.fixture,
            "layout": self.launch.layout,
            "experts": self.launch.experts,
            **({"spec": self.launch.spec} if self.launch.spec != "local" else {}),
            "oracles": list(self.launch.oracles),
            "verdict": SKIPPED if self.skipped else PASS if self.passed else "fail",
            "device": self.device,
            "failing": list(self.failing),
            "first_finding": self.first_finding,
            "seconds": round(self.seconds, 1),
            **({"skipped": self.skipped} if self.skipped else {}),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class SelftestResult:
    """The kill matrix, the clean runs and what it all took."""

    oracles: tuple[str, ...]
    rows: tuple[MutantRow, ...]
    clean: tuple[CleanRow, ...]
    quick: bool
    launches: int
    seconds: float
    versions: dict[str, str] = field(default_factory=dict)
    device: str = "auto"
    """The `--device` asked for; each row says where its launch ran."""
    complete: bool = True
    """False for a matrix written while the selftest still runs (`partial`)."""

    @property
    def survivors(self) -> tuple[MutantRow, ...]:
        """Rows that ran and were not killed: survived, or errored (an error is never a kill)."""
        return tuple(r for r in self.rows if r.status in (SURVIVED, ERRORED))

    @property
    def skipped(self) -> tuple[MutantRow, ...]:
        return tuple(r for r in self.rows if r.status == SKIPPED)

    @property
    def false_alarms(self) -> tuple[CleanRow, ...]:
        return tuple(c for c in self.clean if not c.passed)

    @property
    def passed(self) -> bool:
        """No survivor, no error, no false alarm, and at least one mutant ran (skipping everything is no pass)."""
        ran = len(self.skipped) < len(self.rows) or not self.rows
        return ran and not self.survivors and not self.false_alarms

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": (PASS if self.passed else "fail") if self.complete else "incomplete",
            "complete": self.complete,
            "quick": self.quick,
            "device": self.device,
            "counts": {k: sum(r.status == k for r in self.rows) for k in (KILLED, SURVIVED, ERRORED, SKIPPED)},
            "versions": self.versions,
            "seconds": round(self.seconds, 1),
            "launches": self.launches,
            "oracles": list(self.oracles),
            "mutants": [r.to_dict() for r in self.rows],
            "clean": [c.to_dict() for c in self.clean],
        }


def applicable_oracles(experts: str) -> tuple[str, ...]:
    """Every oracle that can run on this expert layout (all of them, te-grouped included)."""
    return as_oracles(None, experts)


def layout_spec(layout: str) -> str:
    return ParallelLayout.parse(layout).spec


def finding_name(finding: Finding) -> str:
    """The name a finding is attributed by: the tensor, the tensor a `<...>` summary points at, or `logits`."""
    if finding.tensor in FORWARD_TENSORS or finding.kind == "forward-failed":
        return FORWARD
    if finding.tensor.startswith("<") and isinstance(finding.detail.get("tensor"), str):
        return finding.detail["tensor"]
    return finding.tensor


def claims(mutant: Mutant, finding: Finding) -> bool:
    """Whether `mutant`'s targets name this finding."""
    name = finding_name(finding)
    if name == FORWARD:
        return FORWARD in mutant.targets or "*" in mutant.targets
    return any(t != FORWARD and fnmatch.fnmatchcase(name, t) for t in mutant.targets)


@dataclass(frozen=True, kw_only=True, slots=True)
class Attribution:
    """Findings of one report credited to the mutants of its launch."""

    credited: dict[str, dict[str, list[tuple[Finding, ...]]]]
    """mutant name -> oracle -> the findings credited to it."""
    unclaimed: tuple[tuple[str, Finding], ...] = ()
    """(oracle, finding) that no mutant, or more than one, claims."""


def attribute(report: Report, mutants: Sequence[Mutant]) -> Attribution:
    """Credit each finding to the one mutant that claims it (a lone mutant gets every finding)."""
    credited: dict[str, dict[str, list[Finding]]] = {m.name: {} for m in mutants}
    unclaimed: list[tuple[str, Finding]] = []
    for oracle in report.oracles:
        for finding in oracle.findings:
            if UPSTREAM_BUG in finding.detail:
                continue  # a known bridge bug the clean run shows too: no planted bug caused it
            owners = list(mutants) if len(mutants) == 1 else [m for m in mutants if claims(m, finding)]
            if len(owners) == 1:
                credited[owners[0].name].setdefault(oracle.name, []).append(finding)
            else:
                unclaimed.append((oracle.name, finding))
    return Attribution(credited=credited, unclaimed=tuple(unclaimed))  # type: ignore[arg-type]


def cells_for(mutant: Mutant, launch: Launch, credited: dict[str, list[Finding]]) -> dict[str, str]:
    """One cell per oracle: caught / missed where it ran, not run where the launch skipped it, n/a where it can't."""
    usable = (*applicable_oracles(mutant.experts), *launch.oracles)
    out = {}
    for name in launch.columns:
        if name not in usable:
            out[name] = NOT_APPLICABLE
        elif name not in launch.oracles:
            out[name] = NOT_RUN
        else:
            out[name] = CAUGHT if credited.get(name) else MISSED
    return out


def finding_line(oracle: str, finding: Finding, width: int = 160) -> str:
    """`oracle: tensor [kind] message`, cut to `width` characters."""
    text = f"{oracle}: {finding.tensor} [{finding.kind}] {finding.message}"
    return text if len(text) <= width else text[: width - 3] + "..."


def finding_key(oracle: str, finding: Finding) -> dict[str, Any]:
    """What identifies a finding across devices and runs: oracle, tensor, kind and first differing index."""
    return {"oracle": oracle, "tensor": finding.tensor, "kind": finding.kind,
            "first_index": finding.detail.get("first_index")}  # fmt: skip


def first_credited(credited: dict[str, list[Finding]], order: Sequence[str]) -> str | None:
    """The first finding credited to a mutant, in oracle order."""
    for name in order:
        if credited.get(name):
            return finding_line(name, credited[name][0])
    return None


def rows_from(launch: Launch, report: Report, seconds: float) -> tuple[list[MutantRow], Attribution]:
    """The rows of a finished mutant launch, and how its findings were attributed."""
    found = attribute(report, launch.mutants)
    rows = []
    for m in launch.mutants:
        credited = found.credited[m.name]
        rows.append(
            MutantRow(
                mutant=m,
                layout=launch.layout,
                cells=cells_for(m, launch, credited),
                first_finding=first_credited(credited, launch.columns),
                seconds=seconds,
                shared_with=tuple(o.name for o in launch.mutants if o is not m),
                device=report.device,
                findings=tuple(finding_key(o, f) for o in launch.columns for f in credited.get(o, ())),
            )
        )
    return rows, found


def error_rows(launch: Launch, error: str, seconds: float) -> list[MutantRow]:
    """A lone mutant whose run ended in an error: every oracle it would have run is an `error` cell."""
    rows = []
    for m in launch.mutants:
        cells = {o: (ERROR if c in (CAUGHT, MISSED) else c) for o, c in cells_for(m, launch, {}).items()}
        rows.append(MutantRow(mutant=m, layout=launch.layout, cells=cells, first_finding=f"error: {error}",
                              seconds=seconds))  # fmt: skip
    return rows


def clean_row(launch: Launch, report: Report | None, error: str | None, seconds: float) -> CleanRow:
    """The verdict of a clean run: it passes only when every oracle passed."""
    if report is None:
        return CleanRow(launch=launch, passed=False, failing=("error",), first_finding=f"error: {error}",
                        seconds=seconds)  # fmt: skip
    unexplained = {o.name: [f for f in o.findings if UPSTREAM_BUG not in f.detail] for o in report.oracles}
    failing = tuple(o.name for o in report.oracles if unexplained[o.name] or (not o.findings and o.verdict != PASS))
    first = next(
        (finding_line(o.name, unexplained[o.name][0]) for o in report.oracles if unexplained[o.name]),
        next((f"{o.name}: not covered: {o.not_covered}" for o in report.oracles if o.name in failing and o.not_covered),
             f"{failing[0]}: checked nothing" if failing else None),
    )  # fmt: skip
    known = tuple(
        sorted({f.detail[UPSTREAM_BUG] for o in report.oracles for f in o.findings if UPSTREAM_BUG in f.detail})
    )
    return CleanRow(launch=launch, passed=not failing, failing=failing, first_finding=first, seconds=seconds,
                    device=report.device, upstream_bugs=known)  # fmt: skip


def skipped_row(mutant: Mutant, launch: Launch, why: str) -> MutantRow:
    """A mutant whose launch this host cannot run at the asked device: every cell `not run`, the reason noted."""
    cells = {o: (NOT_RUN if c in (CAUGHT, MISSED) else c) for o, c in cells_for(mutant, launch, {}).items()}
    return MutantRow(mutant=mutant, layout=launch.layout, cells=cells, skipped=why)
