"""The rank functions of a version folder (convcheck.workflows.version runs them through `api.run_in_ranks`): write
ckpt/ and the export's shards and manifest, and restore ckpt/ to compare its export with the stored shards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from convcheck.ckpt.manifest import CHECKPOINT_SUBDIR, MANIFEST_NAME, VersionManifest
from convcheck.ckpt.phases import resume_phase, save_phase
from convcheck.ckpt.shards import ShardWriter
from convcheck.rank.context import RankContext
from convcheck.rank.memory import memory_mb, reset_peak
from convcheck.verdict import Finding
from convcheck.versions import versions


def write_in_ranks(
    ctx: RankContext, folder: str, step: int | None, model: str, max_shard_bytes: int
) -> dict[str, Any] | None:
    """Rank function: save ckpt/ as torch_dist, then stream the export into shards and the manifest (rank 0)."""
    root = Path(folder)
    phase = save_phase(ctx, root / CHECKPOINT_SUBDIR, step=step, compare=False)
    writer = ShardWriter(root, max_shard_bytes) if ctx.is_reporter else None
    reset_peak()
    before = memory_mb()
    for name, tensor in ctx.export():
        if writer is not None:
            writer.add(name, tensor)
    if writer is None:
        return None
    findings = list(phase.findings)
    if (failure := ctx.export_failure()) is not None:
        findings.append(failure)
    findings += [
        Finding(tensor=n, kind="duplicate", message="the export produced this name twice") for n in writer.duplicates
    ]
    if not writer.digests:
        findings.append(Finding(tensor="<export>", kind="empty", message="the export produced no tensor"))
    shards = 0
    if findings:
        writer.discard()
    else:
        shards = len(set(writer.close().values()))
        manifest = VersionManifest(
            step=step, layout=ctx.layout, model=model, versions=versions(), tensors=dict(writer.digests)
        )
        (root / MANIFEST_NAME).write_text(manifest.to_json())
    after = memory_mb()
    metrics = {**phase.metrics, **_memory_metrics(before, after)}
    return {
        "findings": [f.to_dict() for f in findings],
        "tensors": len(writer.digests),
        "bytes": sum(d.nbytes for d in writer.digests.values()),
        "shards": shards,
        "metrics": metrics,
    }


def check_in_ranks(ctx: RankContext, folder: str, checkpoint: str, step: int | None) -> dict[str, Any] | None:
    """Rank function: restore the checkpoint into the fresh model, compare its export with the folder's safetensors."""
    phase = resume_phase(ctx, checkpoint)
    if not ctx.is_reporter:
        return None
    findings = list(phase.findings)
    if phase.step != step:
        message = f"the manifest says step {step}, the checkpoint's common state says {phase.step}"
        findings.append(Finding(tensor="<step>", kind="step-differs", message=message))
    return {"findings": [f.to_dict() for f in findings], "checked": phase.checked, "metrics": phase.metrics}


def _memory_metrics(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Rank 0's memory around the streamed export: resident before it, high-water mark during it."""
    return {"rank0_rss_before_export_MB": before.get("VmRSS", -1.0), "rank0_export_peak_MB": after.get("VmHWM", -1.0)}
