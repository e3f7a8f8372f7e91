"""`convcheck selftest`: run the shipped mutants against the installed stack and build the kill matrix.

A launch is one `api.verify` run: one fixture x layout, no hook (a clean run) or one or more mutants. With several
mutants in a launch, each finding is credited to the one mutant whose `targets` name it; a finding that no mutant
(or more than one) claims sends the launch's mutants to run alone.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from typing import Any

from convcheck.errors import ConvcheckError
from convcheck.layout import ParallelLayout
from convcheck.mutants.catalog import FORWARD, MUTANTS, Mutant
from convcheck.verdict import PASS, Finding, Report

CAUGHT, MISSED, NOT_APPLICABLE, NOT_RUN, ERROR = "caught", "missed", "n/a", "not run", "error"
CELLS = (CAUGHT, MISSED, NOT_APPLICABLE, NOT_RUN, ERROR)
KILLED, SURVIVED, ERRORED, SKIPPED = "killed", "survived", "errored", "skipped"
"""A mutant row's status: an oracle caught it; it ran and none did; its launch ended in an error (exit 2 in the
CLI: never a kill); this host could not run its launch at the asked device."""

FORWARD_TENSORS = frozenset({"logits", "greedy-tokens", "<megatron forward>", "<hf forward>"})
"""Finding names of the logits oracle: a target `logits` claims them (they name no tensor)."""

Verify = Callable[..., Report]
"""`api.verify`'s signature: (model, layout, *, oracles, hooks, experts) -> Report."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """One verify run: a fixture at one layout, with the hooks of its mutants (none: a clean run)."""

    fixture: str
    layout: str
    """Canonical spelling (ParallelLayout.spec), e.g. "tp2ep2"."""
    experts: str = "sequential"
    mutants: tuple[Mutant, ...] = ()
    oracles: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.fixture, self.layout, self.experts)

    @property
    def hooks(self) -> tuple[str, ...]:
        return tuple(m.hook for m in self.mutants)

    @property
    def label(self) -> str:
        grid = ParallelLayout.parse(self.layout).label
        experts = "" if self.experts == "sequential" else f" --experts {self.experts}"
        return f"{self.fixture} {grid}{experts}"


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixture": self.launch.fixture,
            "layout": self.launch.layout,
            "experts": self.launch.experts,
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


def check_catalog(mutants: Sequence[Mutant] = MUTANTS, *, deep: bool = False) -> list[str]:
    """Problems with a mutant catalog, one line each (empty when sound); `deep` also checks each layout against
    the fixture's HF config (imports transformers)."""
    from convcheck.api import EXPERT_LAYOUTS
    from convcheck.fixtures import get_spec
    from convcheck.hooks import load_hook
    from convcheck.oracles import ORACLES

    problems: list[str] = []
    seen: set[str] = set()
    for m in mutants:
        if m.name in seen or not m.name.isidentifier():
            problems.append(f"{m.name!r}: names must be unique identifiers")
        seen.add(m.name)
        if not m.description or "\n" in m.description:
            problems.append(f"{m.name}: the description must be one line")
        unknown = [o for o in m.catches if o not in ORACLES]
        if unknown or not m.catches:
            problems.append(f"{m.name}: catches needs known oracles, got {', '.join(unknown) or 'none'}")
        if m.experts not in EXPERT_LAYOUTS:
            problems.append(f"{m.name}: unknown expert layout {m.experts!r}")
        elif m.experts == "te-grouped" and FORWARD in m.catches:
            problems.append(f"{m.name}: te-grouped experts have no forward, logits cannot catch it")
        if not m.targets:
            problems.append(f"{m.name}: targets must name what its findings can be about")
        if not m.fixture.startswith("tiny:"):
            problems.append(f"{m.name}: fixture must be a built-in tiny:<name>, got {m.fixture!r}")
        try:
            if not callable(load_hook(m.hook)):
                problems.append(f"{m.name}: hook {m.hook} is not callable")
            spec = get_spec(m.fixture)
            config = _hf_config(spec.name) if deep else None
            for layout in m.layouts:
                grid = ParallelLayout.parse(layout)
                if config is not None:
                    grid.validate_for(config)
        except ConvcheckError as exc:
            problems.append(f"{m.name}: {exc}")
    return problems


def _hf_config(fixture: str) -> dict[str, object]:
    """The HF config dict a fixture's checkpoint will carry (built from its spec, no checkpoint written)."""
    import transformers

    from convcheck.fixtures import get_spec

    spec = get_spec(fixture)
    return getattr(transformers, spec.config_class)(**spec.config).to_dict()


def applicable_oracles(experts: str) -> tuple[str, ...]:
    """Every oracle that can run on this expert layout (te-grouped has no forward, so no logits)."""
    from convcheck.api import as_oracles

    return as_oracles(None, experts)


def select(mutants: Sequence[Mutant], models: Sequence[str] = (), only: Sequence[str] = ()) -> tuple[Mutant, ...]:
    """The mutants on the given fixtures and/or with the given names; BadInput names what matches nothing."""
    from convcheck.errors import BadInput
    from convcheck.fixtures import get_spec

    chosen = tuple(mutants)
    if models:
        wanted = {f"tiny:{get_spec(m).name}" for m in models}
        unused = sorted(wanted - {m.fixture for m in chosen})
        if unused:
            raise BadInput(f"no mutant in the catalog uses {', '.join(unused)}")
        chosen = tuple(m for m in chosen if m.fixture in wanted)
    if only:
        known = {m.name for m in mutants}
        unknown = [n for n in only if n not in known]
        if unknown:
            raise BadInput(f"unknown mutant {', '.join(unknown)}")
        chosen = tuple(m for m in chosen if m.name in set(only))
        if not chosen:
            raise BadInput("no mutant matches both --model and --only")
    return chosen


def oracles_for(mutant: Mutant, quick: bool) -> tuple[str, ...]:
    """What a launch must run for `mutant`: every applicable oracle, or with --quick those in its `catches`,
    logits only where nothing else is expected to catch it (logits names no tensor, see `plan`)."""
    usable = applicable_oracles(mutant.experts)
    if not quick:
        return usable
    needed = tuple(o for o in usable if o in mutant.catches)
    return needed if needed == (FORWARD,) else tuple(o for o in needed if o != FORWARD)


def plan(mutants: Sequence[Mutant], quick: bool) -> list[Launch]:
    """The mutant launches: each mutant alone at each of its layouts, or (quick) its first layout, shared.

    With --quick, mutants of one fixture x layout share a launch when no two of them could name the same finding
    under the oracles the launch runs (the union of what they need). Logits findings name no tensor, so logits
    joins a shared launch only when exactly one of its mutants changes the forward and expects logits to catch it;
    mutants that change the forward are spread over the launches to make that case common.
    """
    if not quick:
        return [
            Launch(fixture=m.fixture, layout=_spec(lay), experts=m.experts, mutants=(m,), oracles=oracles_for(m, False))
            for m in mutants
            for lay in m.layouts
        ]
    groups: list[list[Mutant]] = []
    for m in mutants:
        fits = [g for g in groups if _same_place(g[0], m) and _compatible([*g, m])]
        calm = [g for g in fits if not any(FORWARD in o.targets for o in g)]
        choices = calm if FORWARD in m.targets and calm else fits
        if choices:
            choices[0].append(m)
        else:
            groups.append([m])
    return [_launch(g) for g in groups]


def clean_launches(launches: Sequence[Launch]) -> list[Launch]:
    """One hook-free launch per fixture x layout x experts used, running every oracle those launches ran."""
    from convcheck.oracles import DEFAULT_ORACLES as ORACLES

    merged: dict[tuple[str, str, str], set[str]] = {}
    for launch in launches:
        merged.setdefault(launch.key, set()).update(launch.oracles)
    return [
        Launch(fixture=f, layout=lay, experts=e, oracles=tuple(o for o in ORACLES if o in names))
        for (f, lay, e), names in merged.items()
    ]


def _spec(layout: str) -> str:
    return ParallelLayout.parse(layout).spec


def _same_place(a: Mutant, b: Mutant) -> bool:
    return (a.fixture, _spec(a.layout), a.experts) == (b.fixture, _spec(b.layout), b.experts)


def _launch(group: Sequence[Mutant]) -> Launch:
    first = group[0]
    wanted = {o for m in group for o in oracles_for(m, True)}
    forward = [m for m in group if FORWARD in m.targets or "*" in m.targets]
    if len(forward) == 1 and FORWARD in forward[0].catches and FORWARD in applicable_oracles(first.experts):
        wanted.add(FORWARD)
    oracles = tuple(o for o in applicable_oracles(first.experts) if o in wanted)
    return Launch(fixture=first.fixture, layout=_spec(first.layout), experts=first.experts, mutants=tuple(group),
                  oracles=oracles)  # fmt: skip


def _compatible(group: Sequence[Mutant]) -> bool:
    """No two mutants of `group` could name one finding under the oracles the group would run."""
    forward = any(FORWARD in oracles_for(m, True) for m in group)
    return not any(targets_meet(a.targets, b.targets, forward) for i, a in enumerate(group) for b in group[i + 1 :])


def targets_meet(a: Sequence[str], b: Sequence[str], forward: bool = True) -> bool:
    """Could one finding be claimed by both target lists? (`logits` only counts when the logits oracle runs;
    a target `*` claims everything, `logits` included.)"""
    for pa in a:
        for pb in b:
            if FORWARD in (pa, pb):
                if forward and {pa, pb} <= {FORWARD, "*"}:
                    return True
            elif globs_meet(pa, pb):
                return True
    return False


@lru_cache(maxsize=4096)
def globs_meet(a: str, b: str) -> bool:
    """Whether two target patterns can name one tensor, reading a `*` before the end of a pattern as one name
    component (no dot): "*.layers.0.*" and "*.layers.1.*" are apart. Planning only: attribution itself uses
    fnmatch, and a finding both mutants claim sends them to run alone."""
    ta, tb = _tokens(a), _tokens(b)

    @cache
    def meet(i: int, j: int) -> bool:
        if i == len(ta) and j == len(tb):
            return True
        star_a = i < len(ta) and ta[i] in _STARS
        if star_a and (meet(i + 1, j) or (j < len(tb) and _absorbs(ta[i], tb[j]) and meet(i, j + 1))):
            return True
        star_b = j < len(tb) and tb[j] in _STARS
        if star_b and (meet(i, j + 1) or (i < len(ta) and _absorbs(tb[j], ta[i]) and meet(i + 1, j))):
            return True
        if i < len(ta) and j < len(tb) and ta[i] not in _STARS and tb[j] not in _STARS:
            return _chars_meet(ta[i], tb[j]) and meet(i + 1, j + 1)
        return False

    return meet(0, 0)


Token = tuple[bool, frozenset[str]]
"""(negated, characters): a literal is (False, {c}), `?` is (True, {}), `[!ab]` is (True, {a, b})."""
_STAR_ALL: Token = (True, frozenset("*"))
_STAR_PART: Token = (True, frozenset("*."))
_STARS = (_STAR_ALL, _STAR_PART)
_ANY: Token = (True, frozenset())
_NOT_DOT: Token = (True, frozenset("."))


def _absorbs(star: Token, other: Token) -> bool:
    """Whether `star` can take one more character matching `other` (or stand in for another star)."""
    return other in _STARS or star == _STAR_ALL or _chars_meet(other, _NOT_DOT)


def _tokens(pattern: str) -> tuple[Token, ...]:
    """Tokens of a pattern: stars (a last `*` spans dots, others one component), `?`, `[...]` classes, literals."""
    out: list[Token] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        close = pattern.find("]", i + 2) if ch == "[" else -1
        if ch == "*":
            out.append(_STAR_ALL if i == len(pattern) - 1 else _STAR_PART)
        elif ch == "?":
            out.append(_ANY)
        elif close > 0:
            body = pattern[i + 1 : close]
            negated = body.startswith("!")
            body = body[1:] if negated else body
            chars: set[str] = set()
            k = 0
            while k < len(body):
                if k + 2 < len(body) and body[k + 1] == "-":
                    chars.update(chr(c) for c in range(ord(body[k]), ord(body[k + 2]) + 1))
                    k += 3
                else:
                    chars.add(body[k])
                    k += 1
            out.append((negated, frozenset(chars)))
            i = close + 1
            continue
        else:
            out.append((False, frozenset(ch)))
        i += 1
    return tuple(out)


def _chars_meet(x: Token, y: Token) -> bool:
    """Whether one character can match both tokens."""
    (nx, cx), (ny, cy) = x, y
    if nx and ny:
        return True
    if nx:
        return bool(cy - cx)
    if ny:
        return bool(cx - cy)
    return bool(cx & cy)


def finding_name(finding: Finding) -> str:
    """The name a finding is attributed by: the tensor, the tensor a `<...>` summary points at, or `logits`."""
    if finding.tensor in FORWARD_TENSORS:
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
            owners = list(mutants) if len(mutants) == 1 else [m for m in mutants if claims(m, finding)]
            if len(owners) == 1:
                credited[owners[0].name].setdefault(oracle.name, []).append(finding)
            else:
                unclaimed.append((oracle.name, finding))
    return Attribution(credited=credited, unclaimed=tuple(unclaimed))  # type: ignore[arg-type]


def cells_for(mutant: Mutant, launch: Launch, credited: dict[str, list[Finding]]) -> dict[str, str]:
    """One cell per oracle: caught / missed where it ran, not run where the launch skipped it, n/a where it can't."""
    from convcheck.oracles import DEFAULT_ORACLES as ORACLES

    usable = applicable_oracles(mutant.experts)
    out = {}
    for name in ORACLES:
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
    from convcheck.oracles import DEFAULT_ORACLES as ORACLES

    found = attribute(report, launch.mutants)
    rows = []
    for m in launch.mutants:
        credited = found.credited[m.name]
        rows.append(
            MutantRow(
                mutant=m,
                layout=launch.layout,
                cells=cells_for(m, launch, credited),
                first_finding=first_credited(credited, tuple(ORACLES)),
                seconds=seconds,
                shared_with=tuple(o.name for o in launch.mutants if o is not m),
                device=report.device,
                findings=tuple(finding_key(o, f) for o in ORACLES for f in credited.get(o, ())),
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
    failing = tuple(o.name for o in report.oracles if o.verdict != PASS)
    first = next(
        (finding_line(o.name, o.findings[0]) for o in report.oracles if o.findings),
        f"{failing[0]}: checked nothing" if failing else None,
    )
    return CleanRow(launch=launch, passed=not failing, failing=failing, first_finding=first, seconds=seconds,
                    device=report.device)  # fmt: skip


Progress = Callable[[str], None]


@dataclass(kw_only=True, slots=True)
class Runner:
    """Runs launches through `verify` at one `--device`, counting them for the progress lines (thread-safe)."""

    verify: Verify
    device: str = "auto"
    timeout_s: float = 600.0
    visible_gpus: int = 0
    say: Progress = lambda _line: None
    total: int = 0
    count: int = 0
    lock: Any = field(default_factory=threading.Lock)

    def skip_reason(self, launch: Launch) -> str | None:
        """Why `--device cuda` cannot run `launch` on this host (too few GPUs), else None."""
        world = ParallelLayout.parse(launch.layout).world_size
        if self.device == "cuda" and world > self.visible_gpus:
            return f"skipped: --device cuda needs {world} GPU(s) for {launch.label}, {self.visible_gpus} visible"
        return None

    def run(self, launch: Launch) -> tuple[Report | None, str | None, float]:
        """(report, error, seconds) of one launch; a ConvcheckError (exit 2 in the CLI) is its error."""
        t0 = time.perf_counter()
        try:
            report = self.verify(launch.fixture, launch.layout, oracles=launch.oracles, hooks=launch.hooks,
                                 experts=launch.experts, timeout_s=self.timeout_s, device=self.device)  # fmt: skip
            error = None
        except ConvcheckError as exc:
            report, error = None, str(exc)
        seconds = time.perf_counter() - t0
        what = ", ".join(m.name for m in launch.mutants) or "clean"
        outcome = f"error: {error}" if error else f"{seconds:.1f} s on {report.device}"  # type: ignore[union-attr]
        with self.lock:
            self.count += 1
            self.say(f"[{self.count}/{self.total}] {launch.label} [{what}] ({','.join(launch.oracles)}): {outcome}")
        return report, error, seconds

    def add(self, launches: int) -> None:
        with self.lock:
            self.total += launches


def run_launch(runner: Runner, launch: Launch) -> list[MutantRow]:
    """The rows of one mutant launch; a shared launch whose findings no single mutant claims (or that failed) is
    rerun one mutant at a time."""
    if (why := runner.skip_reason(launch)) is not None:
        return [skipped_row(m, launch, why) for m in launch.mutants]
    report, error, seconds = runner.run(launch)
    shared = len(launch.mutants) > 1
    if report is not None:
        new_rows, found = rows_from(launch, report, seconds)
        if not (shared and found.unclaimed):
            return new_rows
        why = f"{len(found.unclaimed)} finding(s) of the shared launch claimed by no mutant or by several"
        runner.say(f"  rerunning alone: {why}, e.g. {finding_line(*found.unclaimed[0], width=120)}")
    elif not shared:
        return error_rows(launch, error or "", seconds)
    else:
        why = f"the shared launch failed ({error})"
    runner.add(len(launch.mutants))
    rows: list[MutantRow] = []
    for m in launch.mutants:
        alone = replace(launch, mutants=(m,))
        report, error, seconds = runner.run(alone)
        new_rows = (
            rows_from(alone, report, seconds)[0] if report is not None else error_rows(alone, error or "", seconds)
        )
        rows += [replace(r, note=f"ran alone: {why}") for r in new_rows]
    return rows


def run_clean(runner: Runner, launch: Launch) -> CleanRow:
    """The clean row of one hook-free launch (skipped where `--device cuda` lacks the GPUs)."""
    if (why := runner.skip_reason(launch)) is not None:
        return CleanRow(launch=launch, passed=True, skipped=why)
    report, error, seconds = runner.run(launch)
    return clean_row(launch, report, error, seconds)


def run_selftest(
    mutants: Sequence[Mutant],
    *,
    quick: bool = False,
    verify: Verify | None = None,
    progress: Progress | None = None,
    timeout_s: float = 600.0,
    device: str = "auto",
    jobs: int = 1,
    partial: Callable[[SelftestResult], None] | None = None,
) -> SelftestResult:
    """Run the clean launches and the mutant launches (shared ones rerun alone when attribution is unclear), each
    fixture x layout's launches in order, up to `jobs` fixture x layouts at a time; `partial` gets the matrix so far
    (`complete=False`) after each fixture x layout."""
    from convcheck.device import CHOICES, visible_gpu_count
    from convcheck.errors import BadInput
    from convcheck.oracles import DEFAULT_ORACLES as ORACLES
    from convcheck.versions import versions

    if device not in CHOICES:
        raise BadInput(f"--device must be one of {', '.join(CHOICES)}, got {device!r}")
    if jobs < 1:
        raise BadInput(f"--jobs must be at least 1, got {jobs}")
    real = verify is None
    if verify is None:
        from convcheck.api import verify
    started = time.perf_counter()
    launches = plan(mutants, quick)
    clean = clean_launches(launches)
    gpus = visible_gpu_count() if device == "cuda" else 0
    runner = Runner(verify=verify, device=device, timeout_s=timeout_s, visible_gpus=gpus, say=progress or runner_quiet)
    runner.add(sum(runner.skip_reason(x) is None for x in [*launches, *clean]))

    finished: dict[tuple[str, str, str], tuple[list[CleanRow], list[MutantRow]]] = {}

    def result(complete: bool) -> SelftestResult:
        clean_rows = [c for k in keys if k in finished for c in finished[k][0]]
        rows = [r for k in keys if k in finished for r in finished[k][1]]
        rows.sort(key=lambda r: (order[r.mutant.name], [_spec(lay) for lay in r.mutant.layouts].index(r.layout)))
        return SelftestResult(oracles=tuple(ORACLES), rows=tuple(rows), clean=tuple(clean_rows), quick=quick,
                              launches=runner.count, seconds=time.perf_counter() - started, versions=versions(),
                              device=device, complete=complete)  # fmt: skip

    def one_place(key: tuple[str, str, str]) -> None:
        cleans = [run_clean(runner, c) for c in clean if c.key == key]
        rows = [r for launch in launches if launch.key == key for r in run_launch(runner, launch)]
        with runner.lock:
            finished[key] = (cleans, rows)
            if partial is not None:
                partial(result(complete=False))

    keys = list(dict.fromkeys(lay.key for lay in [*clean, *launches]))
    order = {m.name: i for i, m in enumerate(mutants)}
    if jobs == 1:
        for key in keys:
            one_place(key)
    else:
        if real:
            _build_fixtures({k[0] for k in keys})  # built once, before launches race for the cache
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="selftest") as pool:
            list(pool.map(one_place, keys))
    return result(complete=True)


def runner_quiet(_line: str) -> None:
    """No progress lines."""


def _build_fixtures(fixtures: set[str]) -> None:
    from convcheck.fixtures import build_fixture

    for name in sorted(fixtures):
        build_fixture(name)


def skipped_row(mutant: Mutant, launch: Launch, why: str) -> MutantRow:
    """A mutant whose launch this host cannot run at the asked device: every cell `not run`, the reason noted."""
    cells = {o: (NOT_RUN if c in (CAUGHT, MISSED) else c) for o, c in cells_for(mutant, launch, {}).items()}
    return MutantRow(mutant=mutant, layout=launch.layout, cells=cells, skipped=why)
