"""`convcheck support`: a verdict for every language-model architecture the installed megatron-bridge registers.

Launcher side (no torch): the enumeration and the tiny checkpoints come from the child
`python -m convcheck.fixtures.support_child`; each architecture's verify runs as its own `convcheck verify` process
(`--json`), `jobs` architectures at once. A row is `pass` (every oracle that ran passed), `known-fail` (every finding
is tagged with a known UpstreamBug), `FAIL` (an untagged finding: a defect to triage) or `not-covered` (what
cannot be built or run here, with the reason).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from convcheck.cache import cache_dir
from convcheck.errors import BadInput, SetupError
from convcheck.verdict import FAIL as V_FAIL
from convcheck.verdict import NOT_COVERED as V_NOT_COVERED
from convcheck.verdict import PASS as V_PASS

GENERIC_ORACLES = ("coverage", "roundtrip", "differential", "elements", "layout", "logits")
"""The oracles that need no family table: a row passes every generic oracle when each of these passed."""
PASS, KNOWN_FAIL, FAIL, NOT_COVERED = "pass", "known-fail", "FAIL", "not-covered"
OUTSIDE = "outside"
"""A registered architecture that is not a row: transformers has no class of that name, or it is no language model."""
CHILD = "convcheck.fixtures.support_child"
MAX_FINDINGS = 40
_CODE = ("fixtures/support_child.py", "fixtures/support_shrink.py", "fixtures/values.py")


@dataclass(kw_only=True, slots=True)
class Row:
    """One architecture's line of the table."""

    arch: str
    model_type: str = ""
    status: str = NOT_COVERED
    verdicts: dict[str, str] = field(default_factory=dict)
    """oracle -> pass / fail / not-covered (convcheck.verdict), the worst over the layouts run."""
    layouts: list[str] = field(default_factory=list)
    bugs: list[str] = field(default_factory=list)
    """Names of the known upstream bugs its findings are tagged with."""
    reason: str = ""
    """The first untagged finding, the not-covered reason, or the known bugs' names."""
    findings: list[str] = field(default_factory=list)
    """Every untagged finding, one line each (the first MAX_FINDINGS; JSON only)."""

    def to_dict(self) -> dict[str, Any]:
        return {"arch": self.arch, "model_type": self.model_type, "status": self.status, "verdicts": self.verdicts,
                "layouts": self.layouts, "bugs": self.bugs, "reason": self.reason,
                "findings": self.findings}  # fmt: skip

    @property
    def generic_pass(self) -> bool:
        """Each generic oracle PASS in every layout (verdicts are the worst over the layouts; a layout that gave no
        report makes the row not-covered or leaves its oracles not-covered), whatever the family oracles (config,
        mapping) say: a pass or known-fail row."""
        return self.status in (PASS, KNOWN_FAIL) and all(self.verdicts.get(o) == V_PASS for o in GENERIC_ORACLES)


def checkpoint_root() -> Path:
    """The cache folder of the tiny checkpoints, keyed by the builder's code and the transformers version."""
    here = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(b"".join((here / p).read_bytes() for p in _CODE)).hexdigest()[:12]
    return cache_dir("support") / f"{digest}-transformers{metadata.version('transformers')}"


_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()
_CANCELLED = threading.Event()


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """subprocess.run, with the process known to `stop_all` while it runs (TimeoutExpired past `timeout`)."""
    with _LIVE_LOCK:
        if _CANCELLED.is_set():
            raise SetupError("cancelled")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, env=env)  # fmt: skip
        _LIVE.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stop_all() -> None:
    """Cancel the run: no new process starts; each running one gets SIGTERM (a verify stops its ranks), SIGKILL
    after 10 s."""
    with _LIVE_LOCK:
        _CANCELLED.set()
        procs = list(_LIVE)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _child(args: Sequence[str], timeout: float) -> dict[str, Any]:
    """One JSON answer of the support child; SetupError naming its last stderr line when it gives none."""
    try:
        proc = _run([sys.executable, "-m", CHILD, *args], timeout)
    except subprocess.TimeoutExpired:
        return {"not_covered": f"building the tiny checkpoint took longer than {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
        raise SetupError(f"{CHILD} {args[0]} failed (exit {proc.returncode}): {tail}") from None


def enumerate_architectures(timeout: float = 600) -> list[dict[str, Any]]:
    """Every architecture the installed bridge registers: {"arch", "model_type"[, "not_covered"]}."""
    return list(_child(["list"], timeout)["architectures"])


def select(rows: list[dict[str, Any]], wanted: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of `wanted` (all when empty); BadInput naming an architecture the bridge does not register."""
    if not wanted:
        return rows
    by_name = {r["arch"]: r for r in rows}
    unknown = [w for w in wanted if w not in by_name]
    if unknown:
        raise BadInput(f"--arch {unknown[0]!r} is not registered in the installed megatron-bridge "
                       f"({len(by_name)} architectures; `convcheck support --json F` lists them)")  # fmt: skip
    return [by_name[w] for w in dict.fromkeys(wanted)]


def layouts_for(built: dict[str, Any]) -> list[list[str]]:
    """The verify layouts of a built checkpoint: TP2, and EP2 when it has experts."""
    return [["--tp", "2"], *([["--ep", "2"]] if built.get("experts") else [])]


def run_verify(folder: str, layout: list[str], timeout: float, extra: Sequence[str] = ()) -> dict[str, Any]:
    """`convcheck verify --model folder LAYOUT --device cpu --json`: {"exit", "report" | "error"}."""
    with tempfile.TemporaryDirectory(prefix="convcheck-support-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "convcheck", "verify", "--model", folder, *layout, "--device", "cpu",
               "--json", str(out), "--quiet", "--timeout", str(int(timeout)), *extra]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            proc = _run(cmd, timeout + 120, env)
        except subprocess.TimeoutExpired:
            return {"exit": 2, "error": f"verify did not finish in {timeout + 120:.0f} s"}
        if out.exists():
            return {"exit": proc.returncode, "report": json.loads(out.read_text())}
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}, no report"])[-1]
        return {"exit": proc.returncode, "error": tail.removeprefix("convcheck: error: ")}


MISSING_HERE = (
    "Transformer Engine is not installed",
    "No module named",
    "Found no NVIDIA driver",
    "Torch not compiled with CUDA",
    "cannot build the model on the CPU",
)
"""A build or import failure whose message says this names what this host lacks (a package, TE where convcheck's
stand-in has no counterpart, a CUDA-only call): not-covered, not a finding of the bridge."""
STOPPED_KINDS = ("build-failed", "import-failed")


def missing_here(kind: str, message: str) -> bool:
    """Whether a finding is a build / import that stopped on something this host lacks (MISSING_HERE)."""
    return kind in STOPPED_KINDS and any(text in message for text in MISSING_HERE)


def text_only_forward_failed(arch: str, oracle: str, finding: dict[str, Any]) -> bool:
    """The logits oracle feeds text tokens only; a *ForConditionalGeneration wrapper whose Megatron forward raises
    on them (Qwen2.5-VL's rope index wants image grids) is what convcheck does not run, not a finding."""
    return (arch.endswith("ForConditionalGeneration") and oracle == "logits"
            and (finding["tensor"], finding["kind"]) == ("<megatron forward>", "forward-failed"))  # fmt: skip


def row_from_runs(entry: dict[str, Any], runs: list[tuple[str, dict[str, Any]]]) -> Row:
    """The table row of one architecture from its verify runs ((layout label, run_verify answer) pairs)."""
    row = Row(arch=entry["arch"], model_type=entry.get("model_type", ""))
    untagged: list[str] = []
    not_covered: list[str] = []
    rank = {V_PASS: 0, V_NOT_COVERED: 1, V_FAIL: 2}
    missing_layout = False
    for label, run in runs:
        row.layouts.append(label)
        if "report" not in run:
            not_covered.append(f"{label}: verify exit {run['exit']}: {run.get('error', '')}")
            missing_layout = True
            continue
        for oracle in run["report"]["oracles"]:
            name, verdict = oracle["name"], oracle["verdict"]
            if rank.get(verdict, 2) >= rank.get(row.verdicts.get(name, V_PASS), 0):
                row.verdicts[name] = verdict
            if verdict == V_NOT_COVERED:
                not_covered.append(f"{name}: {oracle.get('not_covered', '')}")
            for finding in oracle.get("findings", []):
                bug = finding.get("detail", {}).get("upstream_bug")
                if not bug and text_only_forward_failed(row.arch, name, finding):
                    row.verdicts[name] = V_NOT_COVERED
                    what = " ".join(finding["message"].split())[:200]
                    not_covered.append(f"{label} {name}: the logits oracle's text-only forward does not run this "
                                       f"vision / audio wrapper: {what}")  # fmt: skip
                    continue
                if not bug and finding["kind"] == "not-supported":  # a release without the API an oracle checks
                    row.verdicts[name] = V_NOT_COVERED  # (bridge 0.3.0 has no megatron_to_hf_config)
                    not_covered.append(f"{label} {name}: {' '.join(finding['message'].split())[:200]}")
                    continue
                if not bug and missing_here(finding["kind"], finding["message"]):
                    row.verdicts[name] = V_NOT_COVERED
                    not_covered.append(
                        f"{label}: convcheck cannot build it here: {' '.join(finding['message'].split())[:300]}"
                    )
                    continue
                if bug:
                    row.bugs.append(bug) if bug not in row.bugs else None
                else:
                    untagged.append(f"{label} {name}: {finding['tensor']} [{finding['kind']}] "
                                    f"{' '.join(finding['message'].split())[:200]}")  # fmt: skip
            if verdict == V_FAIL and not oracle.get("findings"):
                untagged.append(f"{label} {name}: FAIL with no finding (checked {oracle.get('checked')})")
    if missing_layout:  # an oracle that passed in one layout did not run in the other: not covered there
        for name in (*GENERIC_ORACLES, *row.verdicts):
            if row.verdicts.get(name, V_PASS) == V_PASS:
                row.verdicts[name] = V_NOT_COVERED
    row.findings = untagged[:MAX_FINDINGS]
    if untagged:
        row.status, row.reason = FAIL, untagged[0] + (f" (+{len(untagged) - 1} more)" if len(untagged) > 1 else "")
    elif row.bugs:
        row.status, row.reason = KNOWN_FAIL, "known upstream bug(s): " + ", ".join(row.bugs)
        if missing_layout:  # what the other layout could not run says why its oracles are not covered
            row.reason += "; " + next(r for r in not_covered if ": verify exit" in r)
    elif any(": convcheck cannot build it here: " in r for r in not_covered):
        row.status, row.reason = NOT_COVERED, next(r for r in not_covered if ": convcheck cannot build it here: " in r)
    elif not_covered and not any(v == V_PASS for v in row.verdicts.values()):
        row.status, row.reason = NOT_COVERED, not_covered[0]
    elif any(r.startswith(tuple(f"{lbl}: verify" for lbl, _ in runs)) for r in not_covered):
        row.status, row.reason = NOT_COVERED, next(r for r in not_covered if ": verify exit" in r)
    else:
        row.status = PASS
        forward = [r for r in not_covered if "text-only forward" in r]
        family = pass_reason({k: v for k, v in row.verdicts.items() if k != "logits"})
        row.reason = "; ".join(x for x in (*forward[:1], family) if x)
    return row


def pass_reason(verdicts: dict[str, str]) -> str:
    """A pass row's remark: the oracles that were not covered (they need a convcheck family table)."""
    uncovered = [name for name, verdict in verdicts.items() if verdict == V_NOT_COVERED]
    return f"not covered (no convcheck family table): {', '.join(uncovered)}" if uncovered else ""


def support_row(entry: dict[str, Any], root: Path, timeout: float, extra: Sequence[str] = ()) -> Row:
    """Build `entry`'s tiny checkpoint and verify it in every layout (layouts_for); its row."""
    if "not_covered" in entry:
        return Row(arch=entry["arch"], model_type=entry.get("model_type", ""), status=OUTSIDE,
                   reason=entry["not_covered"])  # fmt: skip
    try:
        built = _child(["build", entry["arch"], str(root)], timeout)
    except SetupError as exc:  # the builder died without an answer (killed, out of memory): named, not a crash
        if _CANCELLED.is_set():
            raise
        built = {"not_covered": str(exc)}
    if "folder" not in built:
        return Row(arch=entry["arch"], model_type=entry.get("model_type", ""), reason=built.get("not_covered", ""))
    runs = [(" ".join(lay).replace("--", "").replace(" ", ""), run_verify(built["folder"], lay, timeout, extra))
            for lay in layouts_for(built)]  # fmt: skip
    return row_from_runs(entry, runs)


def run_support(entries: list[dict[str, Any]], *, jobs: int, timeout: float, extra: Sequence[str] = (),
                progress: Callable[[Row], None] | None = None, kept: Sequence[Row] = (),
                saved: Callable[[list[Row]], None] | None = None) -> list[Row]:  # fmt: skip
    """Every entry's row, `jobs` at a time, in the entries' order; `progress` called as each finishes, `saved` with
    the rows finished so far (entries' order) after each. An entry with a row in `kept` (an earlier table,
    `--resume`) keeps that row and is not run again."""
    root = checkpoint_root()
    old = {r.arch: r for r in kept}
    done: dict[str, Row] = {}
    lock = threading.Lock()

    def one(entry: dict[str, Any]) -> Row:
        if entry["arch"] in old and "not_covered" not in entry:
            row = old[entry["arch"]]
        else:
            row = support_row(entry, root, timeout, extra)
            if _CANCELLED.is_set():  # its verify runs may have been stopped mid-way: no row of the table
                return row
            if progress:
                progress(row)
        with lock:
            done[row.arch] = row
            if saved:
                saved([done[e["arch"]] for e in entries if e["arch"] in done])
        return row

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        return list(pool.map(one, entries))
    except BaseException:  # SIGINT / SIGTERM (convcheck.engine.launch.Interrupted): stop every process it started
        stop_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def table_json(rows: Sequence[Row], complete: bool) -> str:
    """The `--json` table: counts, whether every selected architecture has its row, the rows."""
    return json.dumps({"counts": counts(rows), "complete": complete, "rows": [r.to_dict() for r in rows]},
                      indent=2) + "\n"  # fmt: skip


def load_rows(path: str | os.PathLike[str]) -> list[Row]:
    """The rows of a table written by `convcheck support --json`; BadInput when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
        rows = [Row(**{k: r[k] for k in Row.__slots__ if k in r}) for r in data["rows"]]  # type: ignore[attr-defined]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{path} is not a table written by `convcheck support --json`: {exc}") from None
    for row in rows:
        if row.status == PASS:
            row.reason = pass_reason(row.verdicts)
    return rows


def counts(rows: Sequence[Row]) -> dict[str, int]:
    """rows (the registered language-model classes transformers has), pass (every oracle that ran passed),
    pass_generic (Row.generic_pass: each generic oracle PASS in every layout, on a pass or known-fail row),
    known_fail, not_covered, untagged_fail; outside (registered, not rows)."""
    outside = sum(r.status == OUTSIDE for r in rows)
    return {
        "rows": len(rows) - outside,
        "pass": sum(r.status == PASS for r in rows),
        "pass_generic": sum(r.generic_pass for r in rows),
        "known_fail": sum(r.status == KNOWN_FAIL for r in rows),
        "not_covered": sum(r.status == NOT_COVERED for r in rows),
        "untagged_fail": sum(r.status == FAIL for r in rows),
        "outside": outside,
    }


def progress_line(row: Row) -> str:
    """One line per finished architecture."""
    verdicts = " ".join(f"{k}={v}" for k, v in row.verdicts.items())
    return f"{row.status:11} {row.arch} ({row.model_type or '?'}) {verdicts}{' - ' + row.reason if row.reason else ''}"


MARKDOWN_ORACLES = (*GENERIC_ORACLES, "config", "mapping")


def markdown(rows: Sequence[Row], command: str, versions: dict[str, str]) -> str:
    """docs/support.md: generated header, counts, one table row per architecture."""
    c = counts(rows)
    share = f"{100 * c['pass_generic'] / c['rows']:.0f}%" if c["rows"] else "0%"
    lines = [
        "# Architecture support",
        "",
        f"<!-- generated by `{command}`; do not edit by hand -->",
        f"Generated by `{command}` ({', '.join(f'{k} {v}' for k, v in versions.items())}). Every architecture the "
        "installed megatron-bridge registers gets a row: a tiny checkpoint built by transformers from the class's "
        "default config (shrunk: hidden 64, 2 layers or the layer pattern's period (one that does not repeat: its "
        "shortest prefix holding every kind of layer), 4 experts top-2, head_dim 16, vocabulary 256; fixed seed, "
        "distinct bf16 values), verified at TP2 (and EP2 where it has experts) with the "
        "default oracles on the CPU. A row is `pass`, `known-fail` (every finding is a known upstream bug, named), "
        "`FAIL` (an untagged finding) or `not-covered` (what cannot be built or run here, and why).",
        "",
        f"- rows: {c['rows']}",
        f"- pass-all-generic: {c['pass_generic']} ({share} of the rows; each of {', '.join(GENERIC_ORACLES)} PASS "
        "in every layout, on a pass or known-fail row)",
        f"- pass: {c['pass']}",
        f"- FAIL-with-known-upstream-bug: {c['known_fail']}",
        f"- not-covered: {c['not_covered']}",
        f"- untagged FAIL: {c['untagged_fail']}",
        f"- registered, not rows: {c['outside']} (no transformers class of that name, or not a language model)",
        "",
        "| architecture | model_type | status | layouts | " + " | ".join(MARKDOWN_ORACLES) + " | finding or reason |",
        "|---|---|---|---|" + "---|" * len(MARKDOWN_ORACLES) + "---|",
    ]
    for r in (r for r in rows if r.status != OUTSIDE):
        cells = [r.arch, r.model_type, r.status, " ".join(r.layouts),
                 *(r.verdicts.get(o, "") for o in MARKDOWN_ORACLES), r.reason]  # fmt: skip
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    outside = [r for r in rows if r.status == OUTSIDE]
    if outside:
        lines += ["", f"## Registered, not rows ({len(outside)})", "",
                  "The installed megatron-bridge registers these too; they are not rows of the table:", ""]  # fmt: skip
        lines += [f"- {r.arch}: {_cell(r.reason)}" for r in outside]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())
