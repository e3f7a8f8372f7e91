"""Run gate cases (one verify launch each, every oracle, manifest written by rank 0) and record or compare them."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convcheck import api
from convcheck.atomic import write_json_atomic
from convcheck.engine.nodes import Nodes, reports
from convcheck.errors import RUN_ENDING, BadInput, ConvcheckError
from convcheck.gate.case import Case
from convcheck.gate.check import Difference, compare, not_golden, not_run
from convcheck.gate.manifest import load_manifest, write_manifest

INDEX = "index.json"
INDEX_FORMAT = "convcheck-gate-index/1"
Note = Callable[[str], None]
"""Where the runner reports per-case progress lines (stderr in the CLI)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    """How every case of a gate run is launched."""

    device: str = "auto"
    hooks: tuple[str, ...] = ()
    timeout_s: float = 600.0
    nodes: Nodes | None = None
    """Every case spans these hosts (docs/scale.md): one launcher per node, each following node 0 case by case."""

    @property
    def writes(self) -> bool:
        """This node writes the manifests and index (`record`): one node, or node 0 of several."""
        return reports(self.nodes)


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseResult:
    """One case: its manifest (None when it did not run), the error that stopped it, and its differences."""

    case: Case
    manifest: dict[str, Any] | None
    error: str | None = None
    seconds: float = 0.0
    differences: tuple[Difference, ...] = field(default_factory=tuple)


def run_case(case: Case, manifest_path: Path, options: Options) -> tuple[dict[str, Any] | None, str | None]:
    """One verify launch of `case` with every oracle; (manifest, None), or (None, one line) when it could not run."""
    return run_prepared(prepare_case(case, manifest_path, options), manifest_path)


Prepared = tuple[Any, str | None]
"""A case's Job, or (None, the one line saying why it cannot run)."""


def prepare_case(case: Case, manifest_path: Path, options: Options) -> Prepared:
    """`api.prepare` of one case (every oracle, the manifest written to `manifest_path`)."""
    try:
        job = api.prepare(
            case.model,
            case.layout,
            device=options.device,
            hooks=options.hooks,
            experts=case.experts,
            spec=case.spec,
            timeout_s=options.timeout_s,
            pad_vocab=case.pad_vocab,
            manifest_out=str(manifest_path),
            nodes=options.nodes,
        )
    except ConvcheckError as exc:
        return None, str(exc)
    return job, None


def run_prepared(prepared: Prepared, manifest_path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """Launch a prepared case; (manifest, None) or (None, one line). Across nodes, an error that ends the whole run
    (a node lost, nodes that disagree) is raised instead."""
    job, error = prepared
    if job is None:
        return None, error
    try:
        api.run(job)
    except RUN_ENDING:
        raise
    except ConvcheckError as exc:
        return None, str(exc)
    if not manifest_path.is_file():
        return None, "the run ended without writing its manifest"
    return load_manifest(manifest_path), None


def prepared_cases(
    command: str, cases: list[Case], folder: Path, options: Options, agreed: dict[str, Any] | None = None
) -> Iterator[Prepared]:
    """Each case's Job, prepared as it is reached; across nodes, all of them first, and every node agrees on the
    whole run (`command`, each case's Job and `agreed`) before the first launch (NodesDisagree names what differs)."""
    if options.nodes is None:
        return (prepare_case(c, folder / c.file_name, options) for c in cases)
    from convcheck.engine.rollcall import agree

    prepared = [prepare_case(c, folder / c.file_name, options) for c in cases]
    run = {"command": command, "device": options.device, "hooks": list(options.hooks), "timeout_s": options.timeout_s,
           **(agreed or {})}  # fmt: skip
    for case, (job, error) in zip(cases, prepared, strict=True):
        run[f"case {case.id}"] = job.agreed() if job is not None else {"error": error}
    agree(options.nodes, run, options.timeout_s)
    return iter(prepared)


def digests(files: Iterable[Path]) -> dict[str, str | None]:
    """File name -> sha256 of its bytes (None: missing), what every node of a gate check must hold alike."""
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else None for f in files}


def read_index(folder: str | Path) -> dict[str, Case]:
    """The cases of a gate folder, by id; BadInput when the folder or its index is missing or unreadable."""
    path = Path(folder) / INDEX
    if not Path(folder).is_dir():
        raise BadInput(f"gate folder not found: {folder}")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{folder} has no {INDEX} (record one with `convcheck gate record --out {folder}`)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
        raise BadInput(f"{path} is not a gate index of format {INDEX_FORMAT}")
    try:
        return {c["id"]: Case.from_dict(c) for c in data["cases"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"{path}: malformed case entry ({exc})") from None


def write_index(folder: Path, cases: list[Case]) -> None:
    """Add `cases` to the folder's index (kept sorted by id; cases recorded earlier stay)."""
    known = read_index(folder) if (folder / INDEX).is_file() else {}
    known.update({c.id: c for c in cases})
    entries = [{**known[i].to_dict(), "file": known[i].file_name} for i in sorted(known)]
    write_json_atomic(folder / INDEX, {"format": INDEX_FORMAT, "cases": entries})


def record(cases: list[Case], out: Path, options: Options, note: Note | None = None) -> list[CaseResult]:
    """Run every case and write its manifest (and the index) into `out` (across nodes, node 0 alone writes)."""
    with tempfile.TemporaryDirectory(prefix="convcheck-gate-") as scratch:
        folder = out if options.writes else Path(scratch)  # another node's manifests stay in its scratch folder
        if options.writes:
            out.mkdir(parents=True, exist_ok=True)
        results = []
        for i, (case, prepared) in enumerate(zip(cases, prepared_cases("gate record", cases, folder, options)), 1):
            started = time.perf_counter()
            manifest, error = run_prepared(prepared, folder / case.file_name)
            result = CaseResult(case=case, manifest=manifest, error=error, seconds=time.perf_counter() - started)
            if manifest is not None and options.writes:
                write_manifest(out / case.file_name, manifest)
                write_index(out, [case])
            results.append(result)
            _note(note, i, len(cases), result, "recorded" if error is None else f"not recorded: {error}")
    return results


def check(
    cases: list[Case], golden: Path, options: Options, note: Note | None = None, agreed: dict[str, Any] | None = None
) -> list[CaseResult]:
    """Run every case and compare its manifest with the golden one in `golden`; across nodes every node compares
    (the golden files and `agreed`, e.g. the allow entries, must match node 0's)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="convcheck-gate-") as scratch:
        held = {"golden": digests(golden / c.file_name for c in cases), **(agreed or {})} if options.nodes else None
        jobs = prepared_cases("gate check", cases, Path(scratch), options, held)
        for i, (case, prepared) in enumerate(zip(cases, jobs), 1):
            started = time.perf_counter()
            manifest, error = run_prepared(prepared, Path(scratch) / case.file_name)
            golden_file = golden / case.file_name
            if manifest is None:
                diffs = [not_run(case.id, error or "no manifest")]
            elif not golden_file.is_file():
                diffs = [not_golden(case.id)]
            else:
                diffs = compare(load_manifest(golden_file), manifest)
            result = CaseResult(
                case=case,
                manifest=manifest,
                error=error,
                seconds=time.perf_counter() - started,
                differences=tuple(diffs),
            )
            results.append(result)
            _note(note, i, len(cases), result, f"{len(diffs)} difference(s)")
    return results


def _note(note: Note | None, i: int, n: int, result: CaseResult, what: str) -> None:
    if note is not None:
        note(f"[{i}/{n}] {result.case.id}: {what} ({result.seconds:.1f} s)")
