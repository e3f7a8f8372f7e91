"""Version folders: what a trainer keeps per synced version, written and checked.

    DIR/ckpt/                          Megatron distributed checkpoint (torch_dist): the source of truth for resume
    DIR/model-0000N-of-0000M.safetensors, DIR/model.safetensors.index.json, DIR/config.json: the HF export
    DIR/manifest.json                  format tag, step, layout, versions, per-tensor sha256 (convcheck.ckpt.manifest)

`write_version` loads a model through the bridge at a layout (as `verify` does), saves `ckpt/` and streams the export
into shards. `check_version` proves the index against the shards and the manifest against the bytes (no ranks), then
restores `ckpt/` into a fresh model at the manifest's layout and proves the safetensors equal its export, bitwise.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convcheck import api
from convcheck.ckpt.folder import Structure, check_index, check_manifest
from convcheck.ckpt.manifest import (
    DEFAULT_MAX_SHARD_BYTES,
    MANIFEST_NAME,
    VersionManifest,
    read_version_manifest,
)
from convcheck.device import choose_device, visible_gpu_count
from convcheck.errors import BadInput
from convcheck.layout import ParallelLayout
from convcheck.verdict import Finding, OracleVerdict, Report, make_verdict

COPIED = ("config.json", "generation_config.json")
"""Files of the source checkpoint copied beside the export (the bridge needs config.json to load the folder)."""
CHECKS = ("index", "manifest", "checkpoint")


@dataclass(frozen=True, kw_only=True, slots=True)
class WriteResult:
    """What `write_version` wrote (or, with findings, why it wrote nothing)."""

    folder: Path
    findings: tuple[Finding, ...]
    tensors: int = 0
    bytes: int = 0
    shards: int = 0
    metrics: dict[str, Any] | None = None
    seconds: float = 0.0


def write_version(
    folder: str | os.PathLike[str],
    model: str,
    layout: ParallelLayout | str | None = None,
    *,
    step: int | None = None,
    device: str = "auto",
    hooks: tuple[str, ...] = (),
    timeout_s: float = 600.0,
    log_dir: str | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> WriteResult:
    """Load `model` at `layout` through the bridge and write the version folder `folder` (all of it, or nothing)."""
    started = time.perf_counter()
    target = Path(folder)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise BadInput(f"version folder {target} already exists and is not empty")
    if not target.resolve().parent.is_dir():
        raise BadInput(f"parent folder does not exist: {target.parent}")
    if step is not None and step < 0:
        raise BadInput(f"--step must be a non-negative integer, got {step}")
    staging = target.resolve().parent / f".{target.name}.writing-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        kwargs = {"folder": str(staging), "step": step, "model": model, "max_shard_bytes": max_shard_bytes}
        function = "convcheck.ckpt.version_ranks:write_in_ranks"
        value = api.run_in_ranks(
            function, model, layout, kwargs=kwargs, device=device, hooks=hooks, timeout_s=timeout_s, log_dir=log_dir
        )
        findings = tuple(Finding.from_dict(f) for f in value["findings"])
        if not findings:
            source = Path(api.resolve_model(model))
            for name in COPIED:
                if (source / name).is_file():
                    shutil.copy2(source / name, staging / name)
            if target.exists():
                target.rmdir()
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return WriteResult(
        folder=target,
        findings=findings,
        tensors=value["tensors"],
        bytes=value["bytes"],
        shards=value["shards"],
        metrics=value["metrics"],
        seconds=time.perf_counter() - started,
    )


def check_version(
    folder: str | os.PathLike[str],
    *,
    layout: ParallelLayout | str | None = None,
    device: str = "auto",
    hooks: tuple[str, ...] = (),
    timeout_s: float = 600.0,
    log_dir: str | None = None,
    ranks: bool = True,
) -> Report:
    """Check a version folder: index, manifest (no ranks), then its checkpoint's export against the safetensors.

    `layout` (default: the manifest's) is where ckpt/ is restored; `ranks=False` skips that part (it then fails)."""
    started = time.perf_counter()
    root = Path(folder)
    if not root.is_dir():
        raise BadInput(f"version folder not found: {root}")
    manifest = read_version_manifest(root / MANIFEST_NAME)
    grid = api.as_layout(layout) if layout is not None else manifest.layout
    t0 = time.perf_counter()
    structure = check_index(root, manifest.index)
    index = make_verdict("index", checked=len(structure.tensors), findings=list(structure.findings))
    index = _timed(index, t0, {"shards": structure.shards})
    t0 = time.perf_counter()
    checked, findings = check_manifest(root, manifest, structure)
    manifest_verdict = _timed(make_verdict("manifest", checked=checked, findings=findings), t0, {"step": manifest.step})
    checkpoint = _checkpoint_verdict(root, manifest, structure, grid, device, hooks, timeout_s, log_dir, ranks)
    return Report(
        model=str(root),
        layout=grid.to_dict(),
        device=checkpoint.metrics.get("device", "none"),
        versions=manifest.versions,
        oracles=(index, manifest_verdict, checkpoint),
        seconds=time.perf_counter() - started,
    )


def _checkpoint_verdict(
    root: Path,
    manifest: VersionManifest,
    structure: Structure,
    layout: ParallelLayout,
    device: str,
    hooks: tuple[str, ...],
    timeout_s: float,
    log_dir: str | None,
    ranks: bool,
) -> OracleVerdict:
    """Restore ckpt/ at `layout` and compare its export with the stored safetensors (in ranks)."""
    ckpt = root / manifest.checkpoint
    reason = None
    if not ranks:
        reason = "not run (ranks were not requested)"
    elif not structure.loadable:
        reason = "not run: the export's index and shards are inconsistent (see the index check)"
    elif not (ckpt / "metadata.json").is_file():
        reason = f"not run: {ckpt} is not a distributed checkpoint (no metadata.json)"
    if reason is not None:
        return make_verdict(
            "checkpoint", checked=0, findings=[Finding(tensor="<checkpoint>", kind="not-run", message=reason)]
        )
    t0 = time.perf_counter()
    device, _ = choose_device(device, visible_gpu_count() if device != "cpu" else 0, layout.world_size)
    kwargs = {"folder": str(root), "checkpoint": str(ckpt), "step": manifest.step}
    value = api.run_in_ranks(
        "convcheck.ckpt.version_ranks:check_in_ranks", str(root), layout, kwargs=kwargs, device=device, hooks=hooks,
        timeout_s=timeout_s, log_dir=log_dir, load_hf=False,
    )  # fmt: skip
    findings = [Finding.from_dict(f) for f in value["findings"]]
    metrics = {**value["metrics"], "device": device}
    return _timed(make_verdict("checkpoint", checked=value["checked"], findings=findings), t0, metrics)


def _timed(verdict: OracleVerdict, started: float, metrics: dict[str, Any]) -> OracleVerdict:
    return OracleVerdict(
        name=verdict.name,
        checked=verdict.checked,
        unit=verdict.unit,
        findings=verdict.findings,
        rows=verdict.rows,
        seconds=time.perf_counter() - started,
        metrics=metrics,
    )
