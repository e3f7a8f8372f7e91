"""`convcheck selftest`: plan and run the shipped mutants against the installed stack into a kill matrix
(convcheck.workflows.kill_matrix).

A launch is one `api.verify` run: one fixture x layout, no hook (a clean run) or one or more mutants. With several
mutants in a launch, each finding is credited to the one mutant whose `targets` name it; a finding that no mutant
(or more than one) claims sends the launch's mutants to run alone.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from convcheck import api
from convcheck.api import EXPERT_LAYOUTS, LAYER_SPECS
from convcheck.device import CHOICES, visible_gpu_count
from convcheck.engine.nodes import Nodes
from convcheck.errors import RUN_ENDING, BadInput, ConvcheckError
from convcheck.fixtures import get_spec
from convcheck.fixtures.folders import tiny_folder
from convcheck.fixtures.key import layout_path
from convcheck.hooks import problems_elsewhere
from convcheck.layout import ParallelLayout
from convcheck.mutants.catalog import FORWARD, MUTANTS, Mutant
from convcheck.mutants.mutant import VIAS
from convcheck.oracles import DEFAULT_ORACLES, OPTIONS, ORACLES
from convcheck.rollout.environment import SET_ENV, check_python, engine_packs_weights
from convcheck.verdict import Report
from convcheck.versions import versions
from convcheck.workflows.kill_matrix import (
    CleanRow,
    Launch,
    MutantRow,
    SelftestResult,
    Verify,
    applicable_oracles,
    clean_row,
    error_rows,
    finding_line,
    layout_spec,
    rows_from,
    skipped_row,
)
from convcheck.workflows.targets import targets_meet


def check_catalog(mutants: Sequence[Mutant] = MUTANTS, *, deep: bool = False) -> list[str]:
    """Problems with a mutant catalog, one line each (empty when sound); `deep` also checks each layout against
    the fixture's HF config (its stored config.json)."""
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
        if m.spec not in LAYER_SPECS:
            problems.append(f"{m.name}: unknown layer specs {m.spec!r}")
        if m.via not in VIAS:
            problems.append(f"{m.name}: via must be one of {', '.join(VIAS)}, got {m.via!r}")
        unowned = [k for k, _ in m.options if k not in OPTIONS or OPTIONS[k][0] not in m.catches]
        if unowned:
            problems.append(f"{m.name}: options must be those of the oracles it is caught by, got {', '.join(unowned)}")
        if not m.targets:
            problems.append(f"{m.name}: targets must name what its findings can be about")
        if not m.fixture.startswith("tiny:"):
            problems.append(f"{m.name}: fixture must be a built-in tiny:<name>, got {m.fixture!r}")
        try:
            spec = get_spec(m.fixture)
            config = _hf_config(spec.name) if deep else None
            for layout in m.layouts:
                grid = ParallelLayout.parse(layout)
                if config is not None:
                    grid.validate_for(config)
        except ConvcheckError as exc:
            problems.append(f"{m.name}: {exc}")
    hooks = {m.hook: m.name for m in mutants}
    problems += [f"{hooks[spec]}: {text}" for spec, text in problems_elsewhere("hook", list(hooks)).items()]
    return problems


def _hf_config(fixture: str) -> dict[str, object]:
    """The HF config dict a fixture's checkpoint will carry: its stored layout's config.json (no checkpoint written)."""
    return json.loads(json.loads(layout_path(get_spec(fixture)).read_text())["config"])


def select(mutants: Sequence[Mutant], models: Sequence[str] = (), only: Sequence[str] = ()) -> tuple[Mutant, ...]:
    """The mutants on the given fixtures and/or with the given names; BadInput names what matches nothing."""
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
    if not shares(mutant):
        return mutant.catches  # its own oracles only: the bug is planted where no default oracle looks
    if not quick:
        return usable
    needed = tuple(o for o in usable if o in mutant.catches)
    return needed if needed == (FORWARD,) else tuple(o for o in needed if o != FORWARD)


def shares(mutant: Mutant) -> bool:
    """Whether `mutant` is planted by `--hook` and caught by default oracles only (it may share a launch and joins
    the default oracles' launches); else it runs alone with the oracles of its `catches` (the engine path)."""
    return mutant.via == "hook" and set(mutant.catches) <= set(DEFAULT_ORACLES)


def plan(mutants: Sequence[Mutant], quick: bool) -> list[Launch]:
    """The mutant launches: each mutant alone at each of its layouts, or (quick) its first layout, shared.

    With --quick, mutants of one fixture x layout share a launch when no two of them could name the same finding
    under the oracles the launch runs (the union of what they need). Logits findings name no tensor, so logits
    joins a shared launch only when exactly one of its mutants changes the forward and expects logits to catch it;
    mutants that change the forward are spread over the launches to make that case common.
    """
    if not quick:
        return [
            Launch(
                fixture=m.fixture,
                layout=layout_spec(lay),
                experts=m.experts,
                spec=m.spec,
                mutants=(m,),
                oracles=oracles_for(m, False),
            )
            for m in mutants
            for lay in m.layouts
        ]
    groups: list[list[Mutant]] = []
    for m in mutants:
        fits = [g for g in groups if shares(m) and shares(g[0]) and _same_place(g[0], m) and _compatible([*g, m])]
        calm = [g for g in fits if not any(FORWARD in o.targets for o in g)]
        choices = calm if FORWARD in m.targets and calm else fits
        if choices:
            choices[0].append(m)
        else:
            groups.append([m])
    return [_launch(g) for g in groups]


def clean_launches(launches: Sequence[Launch]) -> list[Launch]:
    """One hook-free launch per fixture x layout x experts used, running every oracle those launches ran (with
    their default options: a mutant's oracle options are part of how it is planted)."""
    merged: dict[tuple[str, str, str, str], set[str]] = {}
    for launch in launches:
        merged.setdefault(launch.key, set()).update(launch.oracles)
    return [
        Launch(fixture=f, layout=lay, experts=e, spec=s, oracles=tuple(o for o in ORACLES if o in names))
        for (f, lay, e, s), names in merged.items()
    ]


def _same_place(a: Mutant, b: Mutant) -> bool:
    return (a.fixture, layout_spec(a.layout), a.experts, a.spec) == (
        b.fixture,
        layout_spec(b.layout),
        b.experts,
        b.spec,
    )


def _launch(group: Sequence[Mutant]) -> Launch:
    first = group[0]
    wanted = {o for m in group for o in oracles_for(m, True)}
    forward = [m for m in group if FORWARD in m.targets or "*" in m.targets]
    if len(forward) == 1 and FORWARD in forward[0].catches and FORWARD in applicable_oracles(first.experts):
        wanted.add(FORWARD)
    oracles = tuple(o for o in (*applicable_oracles(first.experts), *first.catches) if o in wanted)
    oracles = tuple(dict.fromkeys(oracles))
    return Launch(fixture=first.fixture, layout=layout_spec(first.layout), experts=first.experts, spec=first.spec,
                  mutants=tuple(group), oracles=oracles)  # fmt: skip


def _compatible(group: Sequence[Mutant]) -> bool:
    """No two mutants of `group` could name one finding under the oracles the group would run."""
    forward = any(FORWARD in oracles_for(m, True) for m in group)
    return not any(targets_meet(a.targets, b.targets, forward) for i, a in enumerate(group) for b in group[i + 1 :])


NO_PACKING = (
    "this CPU's vLLM backend packs no dense weight away at load (no AMX or oneDNN: it computes with the live "
    "parameters), so loading weights past vLLM's reload path is no bug here"
)
"""Why a Mutant.engine_packing entry is skipped on such a host."""

Progress = Callable[[str], None]
ENGINE = "engine"
"""The oracle whose launches need the engine's environment (`make env-vllm`)."""


@dataclass(kw_only=True, slots=True)
class Runner:
    """Runs launches through `verify` at one `--device`, counting them for the progress lines (thread-safe)."""

    verify: Verify
    device: str = "auto"
    timeout_s: float = 600.0
    visible_gpus: int = 0
    nodes: Nodes | None = None
    """Launches span these hosts (each node follows node 0 launch by launch); one whose ranks the nodes cannot
    split evenly (TP1) runs on every node by itself, as the layout oracle's TP1 job does."""
    say: Progress = lambda _line: None
    total: int = 0
    count: int = 0
    lock: Any = field(default_factory=threading.Lock)
    engine_missing: str | None = None
    """Why the engine oracle cannot run here ("" once its environment was found); None until asked."""
    packs: bool | None = None
    """Whether this host's vLLM packs dense weights away at load; None until asked."""

    def spans(self, launch: Launch) -> Nodes | None:
        """The nodes `launch` spans: all of them when they split its ranks evenly, else None (this node alone)."""
        world = ParallelLayout.parse(launch.layout).world_size
        return self.nodes if self.nodes is not None and world % self.nodes.nnodes == 0 else None

    def skip_reason(self, launch: Launch) -> str | None:
        """Why this host cannot run `launch` (no engine environment for the engine oracle, or too few GPUs for
        `--device cuda`), else None."""
        if ENGINE in launch.oracles and (why := self.no_engine()) is not None:
            return f"skipped: {why}"
        if any(m.engine_packing for m in launch.mutants) and not self.engine_packs():
            return f"skipped: {NO_PACKING}"
        world = ParallelLayout.parse(launch.layout).world_size
        nodes = self.spans(launch)
        here = world if nodes is None else nodes.per_node(world)
        if self.device == "cuda" and here > self.visible_gpus:
            return f"skipped: --device cuda needs {here} GPU(s) for {launch.label}, {self.visible_gpus} visible"
        return None

    def engine_packs(self) -> bool:
        """Whether this host's vLLM packs its dense weights away at load (asked once, of vLLM itself)."""
        with self.lock:
            if self.packs is None:
                self.packs = engine_packs_weights(check_python(None, name=SET_ENV))
            return self.packs

    def no_engine(self) -> str | None:
        """Why the engine oracle cannot run here (its environment missing, in one line), else None; asked once."""
        with self.lock:
            if self.engine_missing is None:
                try:
                    check_python(None, name=SET_ENV)
                    self.engine_missing = ""
                except BadInput as exc:
                    self.engine_missing = str(exc)
            return self.engine_missing or None

    def run(self, launch: Launch) -> tuple[Report | None, str | None, float]:
        """(report, error, seconds) of one launch; a ConvcheckError (exit 2 in the CLI) is its error."""
        t0 = time.perf_counter()
        nodes = self.spans(launch)
        across: dict[str, Any] = {} if nodes is None else {"nodes": nodes}
        if launch.sender is not None:
            across["sender"] = launch.sender
        if launch.options:
            across["options"] = launch.options
        try:
            report = self.verify(launch.fixture, launch.layout, oracles=launch.oracles, hooks=launch.hooks,
                                 experts=launch.experts, spec=launch.spec, timeout_s=self.timeout_s, device=self.device,
                                 **across)  # fmt: skip
            error = None
        except RUN_ENDING:
            raise
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
    nodes: Nodes | None = None,
) -> SelftestResult:
    """Run the clean launches and the mutant launches (shared ones rerun alone when attribution is unclear), each
    fixture x layout's launches in order, up to `jobs` fixture x layouts at a time; `partial` gets the matrix so far
    (`complete=False`) after each fixture x layout. `nodes`: the launches span hosts, every node agreeing on the
    run first (NodesDisagree names what differs) and following node 0 launch by launch."""
    if device not in CHOICES:
        raise BadInput(f"--device must be one of {', '.join(CHOICES)}, got {device!r}")
    check_jobs(jobs, nodes)
    real = verify is None
    if verify is None:
        verify = api.verify
    started = time.perf_counter()
    launches = plan(mutants, quick)
    clean = clean_launches(launches)
    gpus = visible_gpu_count() if device == "cuda" else 0
    runner = Runner(verify=verify, device=device, timeout_s=timeout_s, visible_gpus=gpus, nodes=nodes,
                    say=progress or (lambda _line: None))  # fmt: skip
    if nodes is not None:
        _agree(nodes, runner, [*clean, *launches], quick)
    runner.add(sum(runner.skip_reason(x) is None for x in [*launches, *clean]))

    finished: dict[tuple[str, str, str], tuple[list[CleanRow], list[MutantRow]]] = {}

    def result(complete: bool) -> SelftestResult:
        clean_rows = [c for k in keys if k in finished for c in finished[k][0]]
        rows = [r for k in keys if k in finished for r in finished[k][1]]
        rows.sort(key=lambda r: (order[r.mutant.name], [layout_spec(lay) for lay in r.mutant.layouts].index(r.layout)))
        return SelftestResult(oracles=columns, rows=tuple(rows), clean=tuple(clean_rows), quick=quick,
                              launches=runner.count, seconds=time.perf_counter() - started, versions=versions(),
                              device=device, complete=complete)  # fmt: skip

    def one_place(key: tuple[str, str, str]) -> None:
        cleans = [run_clean(runner, c) for c in clean if c.key == key]
        rows = [r for launch in launches if launch.key == key for r in run_launch(runner, launch)]
        with runner.lock:
            finished[key] = (cleans, rows)
            if partial is not None:
                partial(result(complete=False))

    columns = tuple(dict.fromkeys(o for x in [*clean, *launches] for o in x.columns)) or tuple(DEFAULT_ORACLES)
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


def check_jobs(jobs: int, nodes: Nodes | None) -> None:
    """BadInput unless `jobs` is at least 1, and 1 across nodes (every node makes the launches in node 0's order)."""
    if jobs < 1:
        raise BadInput(f"--jobs must be at least 1, got {jobs}")
    if nodes is not None and jobs > 1:
        raise BadInput("--jobs must be 1 with --nnodes (every node makes the launches in node 0's order)")


def _agree(nodes: Nodes, runner: Runner, launches: Sequence[Launch], quick: bool) -> None:
    """Every node of a multi-node selftest was asked the same launches (NodesDisagree names what differs)."""
    from convcheck.engine.rollcall import agree

    planned = [f"{x.label} [{','.join(m.name for m in x.mutants) or 'clean'}] {','.join(x.oracles)}" for x in launches]
    mutants = sorted({m.name for x in launches for m in x.mutants})
    run = {"command": "selftest", "mutants": mutants, "quick": quick, "device": runner.device,
           "timeout_s": runner.timeout_s, "gpus": runner.visible_gpus, "launches": planned}  # fmt: skip
    agree(nodes, run, runner.timeout_s)


def _build_fixtures(fixtures: set[str]) -> None:
    for name in sorted(fixtures):
        tiny_folder(name)
