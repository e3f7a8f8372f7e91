"""`convcheck bisect`: find the first commit of a Megatron-Bridge history whose gate manifest (or verify verdict)
differs from the good commit's; each step builds (or reuses) the commit's candidate environment and runs the case
there. Commits that cannot be installed or run are skipped, as `git bisect skip` does (launcher side, no torch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from convcheck.errors import BadInput, ConvcheckError
from convcheck.gate.check import compare
from convcheck.workflows.candidate import Source, bridge_commit, git, git_dir, nearest_release, plan
from convcheck.workflows.candidate_env import build

GOOD, BAD, SKIP = "good", "bad", "skip"
Note = Callable[[str], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class Spec:
    """What to bisect and how each step runs."""

    repo: str
    good: str
    bad: str
    case: str | None = None
    verify: tuple[str, ...] = ()
    """Arguments of `convcheck verify` (instead of a gate case): exit 0 good, 1 bad, anything else skip."""
    hooks: tuple[str, ...] = ()
    core: str | None = None
    transformers: str | None = None
    jobs: int = 1
    timeout_s: float = 600.0
    env_dir: Path = Path(".")
    base: Path = Path(".venv")


@dataclass(frozen=True, kw_only=True, slots=True)
class Step:
    """One tested commit: good, bad or skip, why, and the differences that made it bad."""

    commit: str
    subject: str
    state: str
    why: str
    seconds: float
    differences: tuple[str, ...] = ()


@dataclass(kw_only=True, slots=True)
class Outcome:
    """The first bad commit (None when not found), every step, and the commits that only skips leave open."""

    first_bad: Step | None
    steps: list[Step] = field(default_factory=list)
    commits: int = 0
    open_range: list[str] = field(default_factory=list)
    reason: str = ""
    pins: str = ""


def history(gdir: str, good: str, bad: str) -> list[str]:
    """Commits after `good` up to `bad` (oldest first, bad last); BadInput when good is not an ancestor of bad."""
    ids = []
    for ref in (good, bad):
        try:
            ids.append(git(gdir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"))
        except BadInput:
            raise BadInput(f"unknown revision {ref!r} in {gdir}") from None
    if subprocess.run(["git", "--git-dir", gdir, "merge-base", "--is-ancestor", *ids]).returncode != 0:
        raise BadInput(f"good {good} is not an ancestor of bad {bad}")
    if ids[0] == ids[1]:
        raise BadInput(f"good {good} and bad {bad} are the same commit")
    out = git(gdir, "rev-list", "--topo-order", "--reverse", "--ancestry-path", f"{ids[0]}..{ids[1]}")
    return out.split()


class Runner:
    """Builds a commit's environment and runs the case (or verify) in it; compares with the good manifest."""

    def __init__(self, spec: Spec, gdir: str, pins: str, scratch: Path) -> None:
        self.spec, self.gdir, self.pins, self.scratch = spec, gdir, pins, scratch
        self.reference: dict | None = None
        self.active: set[subprocess.Popen] = set()

    def run(self, commit: str) -> Step:
        started = time.perf_counter()
        src = bridge_commit(self.gdir, commit)
        try:
            p = plan(src, core=self.spec.core, transformers=self.spec.transformers, pins=self.pins)
            env = build(p, self.spec.env_dir / p.name, self.spec.base, note=lambda _: None)
        except ConvcheckError as exc:
            return self._step(src, SKIP, f"cannot be installed: {exc}", started)
        if self.spec.verify:
            return self._verify(env, src, started)
        out = self.scratch / f"{commit}.json"
        hooks = [a for h in self.spec.hooks for a in ("--hook", h)]
        args = [str(env / "bin" / "python"), "-m", "convcheck.workflows.bisect_step", self.spec.case or "", str(out),
                "--timeout", str(self.spec.timeout_s), *hooks]  # fmt: skip
        done = self._call(args)
        if done.returncode != 0 or not out.is_file():
            return self._step(src, SKIP, f"case did not run: {_error(out, done)}", started)
        manifest = json.loads(out.read_text())
        if self.reference is None:
            self.reference = manifest
            return self._step(src, GOOD, "reference manifest recorded", started)
        diffs = compare(self.reference, manifest)
        lines = tuple(f"{d.subject}: [{d.kind}] {d.message}" for d in diffs)
        why = "manifest equals the good commit's" if not diffs else f"{len(diffs)} difference(s) from the good commit's"
        return self._step(src, BAD if diffs else GOOD, why, started, lines)

    def _verify(self, env: Path, src: Source, started: float) -> Step:
        args = [str(env / "bin" / "convcheck"), "verify", *self.spec.verify, "--timeout", str(self.spec.timeout_s)]
        args += [a for h in self.spec.hooks for a in ("--hook", h)]
        done = self._call(args)
        lines = tuple(ln for ln in done.stdout.splitlines() if ln.strip() and not ln.startswith("replay:"))[-6:]
        if done.returncode in (0, 1):
            state = GOOD if done.returncode == 0 else BAD
            return self._step(src, state, f"verify exit {done.returncode}", started, lines if state == BAD else ())
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return self._step(src, SKIP, f"verify did not run: {tail}", started)

    def _call(self, args: list[str]) -> subprocess.CompletedProcess:
        """Run one step's command in a session of its own, so `stop()` can end it (and its ranks) on a signal."""
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_step_env(),
                                start_new_session=True)  # fmt: skip
        self.active.add(proc)
        try:
            out, err = proc.communicate()
        except BaseException:  # a signal while this thread waited: the step goes too
            self.stop()
            raise
        finally:
            self.active.discard(proc)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def stop(self) -> None:
        """SIGTERM every running step (convcheck stops its ranks and removes its folders), SIGKILL after 30 s."""
        for proc in list(self.active):
            proc.terminate()
        for proc in list(self.active):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    @staticmethod
    def _step(src: Source, state: str, why: str, started: float, lines: tuple[str, ...] = ()) -> Step:
        return Step(commit=src.commit, subject=src.subject or "", state=state, why=why,
                    seconds=time.perf_counter() - started, differences=lines)  # fmt: skip


def _step_env() -> dict[str, str]:
    """The step's environment: no warm-rank socket of the caller's stack, no PYTHONPATH."""
    return {k: v for k, v in os.environ.items() if k not in ("CONVCHECK_WARM_SOCKET", "PYTHONPATH", "PYTHONHOME")}


def _error(out: Path, done: subprocess.CompletedProcess) -> str:
    try:
        return json.loads(Path(f"{out}.error").read_text())["error"]
    except (OSError, ValueError, KeyError):
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return tail[:300]


def _picks(lo: int, hi: int, tested: set[int], skipped: set[int], jobs: int) -> list[int]:
    """Up to `jobs` untested commits strictly between lo and hi, nearest the points that split the range evenly; with
    k skipped commits in the range, none within 2**k - 1 of a skipped one while others are left (a run of commits
    that cannot be tested is jumped over in a few steps, not walked)."""
    open_ = [i for i in range(lo + 1, hi) if i not in tested]
    skips = [s for s in skipped if lo < s < hi]
    radius = (1 << len(skips)) - 1 if skips else 0
    picks: list[int] = []
    for k in range(min(jobs, len(open_))):
        target = lo + (k + 1) * (hi - lo) / (min(jobs, len(open_)) + 1)
        free = [i for i in open_ if i not in picks]
        far = [i for i in free if all(abs(i - s) > radius for s in skips)] or free
        picks.append(min(far, key=lambda i: (abs(i - target), i)))
    return sorted(picks)


def bisect(spec: Spec, note: Note) -> Outcome:
    """Test good (its manifest is the reference) and bad, then halve the commits between until one is left."""
    if bool(spec.case) == bool(spec.verify):
        raise BadInput("give one of --case ID or --verify 'ARGS'")
    gdir = git_dir(spec.repo)
    commits = history(gdir, spec.good, spec.bad)
    good = git(gdir, "rev-parse", f"{spec.good}^{{commit}}")
    pins = nearest_release(bridge_commit(gdir, commits[-1]).version).bridge
    spec.env_dir.mkdir(parents=True, exist_ok=True)
    outcome = Outcome(first_bad=None, commits=len(commits), pins=pins)
    with tempfile.TemporaryDirectory(prefix="convcheck-bisect-") as scratch:
        runner = Runner(spec, gdir, pins, Path(scratch))
        try:
            for label, commit in (("good", good), ("bad", commits[-1])):
                step = runner.run(commit)
                _progress(note, len(outcome.steps), step, f"({label} end)")
                outcome.steps.append(step)
                expected = GOOD if label == "good" else BAD
                if step.state == SKIP:
                    raise BadInput(f"the {label} commit {commit[:9]} cannot be tested: {step.why}")
                if step.state != expected:
                    outcome.reason = f"the bad commit {commit[:9]} gives the good commit's result: nothing to find"
                    return outcome
            lo, hi, tested, skipped = -1, len(commits) - 1, {len(commits) - 1}, set()
            with ThreadPoolExecutor(max_workers=max(1, spec.jobs)) as pool:
                while picks := _picks(lo, hi, tested, skipped, spec.jobs):
                    for i, step in zip(picks, pool.map(lambda i: runner.run(commits[i]), picks)):
                        tested.add(i)
                        outcome.steps.append(step)
                        if step.state == GOOD:
                            lo = max(lo, i)
                        elif step.state == BAD:
                            hi = min(hi, i)
                        else:
                            skipped.add(i)
                        left = sum(1 for j in range(lo + 1, hi) if j not in tested)
                        _progress(note, len(outcome.steps) - 1, step, f"[{i + 1}/{len(commits)}]; {left} untested left")
        finally:
            runner.stop()
    states = {s.commit: s for s in outcome.steps}
    between = [c for c in commits[lo + 1 : hi] if states.get(c) and states[c].state == SKIP]
    if between:
        outcome.open_range = [*between, commits[hi]]
        outcome.reason = "only skipped commits are left: the first bad commit is one of these"
        return outcome
    outcome.first_bad = states[commits[hi]]
    return outcome


def _progress(note: Note, n: int, step: Step, where: str) -> None:
    note(f"bisect: step {n}: {step.commit[:9]} {step.state}: {step.why} ({step.seconds:.1f} s) {where}")
