"""The layout oracle's TP1 reference: a 1-rank job, run only after a multi-rank export differed from the source,
that writes a digest manifest (cached by content) to attribute those differences."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from convcheck.cache import cache_dir, unchanged
from convcheck.engine.job import Job
from convcheck.engine.launch import run_ranks
from convcheck.layout import ParallelLayout
from convcheck.oracles.attribution import attribute, pending
from convcheck.progress import ProgressSink
from convcheck.verdict import OracleVerdict
from convcheck.versions import versions

LAYOUT_ORACLE = "layout"


def reference_key(job: Job) -> str:
    """Cache key of the TP1 manifest: checkpoint files, hooks, device, expert layout, interpreter and import path.

    The code that made a manifest is checked separately, by content (`usable`): a key alone cannot see an edited
    bridge whose version string did not change."""
    key = hashlib.sha256()
    fields = {"model": job.model_path, "hooks": list(job.hooks), "device": job.device, "experts": job.experts,
              "spec": job.spec}  # fmt: skip
    if job.sync.sender is not None:  # the TP1 export runs through the same sender
        fields["sender"] = job.sync.sender
    if job.pad_vocab is not None:
        fields["pad_vocab"] = job.pad_vocab
    where = {"python": sys.executable, "path": sys.path, "pythonpath": os.environ.get("PYTHONPATH", "")}
    key.update(json.dumps({**fields, **where, "v": versions()}, sort_keys=True).encode())
    specs = (*job.hooks, *((job.sync.sender,) if job.sync.sender else ()))
    hook_files = [Path(h.rpartition(":")[0]) for h in specs if h.rpartition(":")[0].endswith(".py")]
    for path in sorted(Path(job.model_path).glob("*.safetensors")) + hook_files:
        stat = path.stat()
        key.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return key.hexdigest()[:24]


def reference_manifest(job: Job, log_dir: str | None = None, progress: ProgressSink | None = None) -> Path:
    """Run (or reuse from the cache) the 1-rank TP1 job that writes the digest manifest for `job`'s checkpoint."""
    manifest = cache_dir("layout") / f"{reference_key(job)}.json"
    if usable(manifest):
        return manifest
    ref_job = replace(
        job,
        layout=ParallelLayout(),
        oracles=(LAYOUT_ORACLE,),
        workdir=".",
        write_manifest=str(manifest),
        manifest_out=None,
        nodes=None,  # one rank: each node of a multi-node run makes (or reuses) its own, standalone
    )
    prefixed = None
    if progress is not None:

        def prefixed(event: dict) -> None:
            progress({**event, "phase": f"TP1 reference job (layout oracle): {event.get('phase', '')}"})

    run_ranks(ref_job, log_dir=str(Path(log_dir) / "layout-tp1") if log_dir else None, progress=prefixed)
    return manifest


def usable(manifest: Path) -> bool:
    """A cached manifest is reused only if every source file that produced it still has the same content."""
    try:
        recorded = json.loads(manifest.read_text()).get("sources", {})
    except (OSError, json.JSONDecodeError):
        return False
    return unchanged(recorded)


def attribute_layout(
    job: Job, verdicts: tuple[OracleVerdict, ...], log_dir: str | None = None, progress: ProgressSink | None = None
) -> tuple[OracleVerdict, ...]:
    """`verdicts` with a pending layout verdict attributed by the TP1 manifest (launched, or reused from the cache,
    only then); every other verdict unchanged."""
    if not any(pending(v) for v in verdicts):
        return verdicts
    started = time.perf_counter()
    manifest = reference_manifest(job, log_dir, progress)
    seconds = round(time.perf_counter() - started, 3)
    return tuple(attribute(v, manifest, job.layout.label, seconds) if pending(v) else v for v in verdicts)
