"""Layout oracle: the export at the requested layout is byte-identical to a TP1 export and to the source.

Design: a TP1 export needs its own model, so before the main job the CLI runs a separate 1-rank job of this
oracle with CONVCHECK_LAYOUT_WRITE set; it writes a digest manifest (per tensor: dtype, shape, sha256 of raw
bytes), cached per (checkpoint, hooks, versions). The main job gets the manifest path in CONVCHECK_LAYOUT_MANIFEST,
digests its own export on rank 0 and names every tensor that differs; a differing tensor is then compared with
the source bytes (first differing index, and the rearrangement from convcheck.diagnose when one explains it).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from convcheck.engine.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "layout"
ENV_WRITE = "CONVCHECK_LAYOUT_WRITE"
ENV_MANIFEST = "CONVCHECK_LAYOUT_MANIFEST"


def digest(tensor: Any) -> dict[str, Any]:
    """dtype, shape and sha256 of the raw bytes of one tensor."""
    from convcheck.bits import int_view

    t = tensor.detach().cpu().contiguous()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "sha256": hashlib.sha256(int_view(t).numpy().tobytes()).hexdigest(),
    }


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains the export; rank 0 writes the manifest (reference job) or compares with it."""
    write_to = os.environ.get(ENV_WRITE)
    ref_path = os.environ.get(ENV_MANIFEST)
    reference = json.loads(Path(ref_path).read_text()) if ref_path and Path(ref_path).is_file() else None
    ref = (reference or {}).get("tensors", {})
    digests: dict[str, dict[str, Any]] = {}
    kept: dict[str, Any] = {}
    for name, tensor in ctx.export():
        if ctx.is_reporter:
            digests[name] = digest(tensor)
            if name in ref and digests[name] != ref[name]:
                kept[name] = tensor  # only differing tensors are kept, for diagnosis without a rerun
    if not ctx.is_reporter:
        return None
    if write_to:
        from convcheck.engine.job import write_json_atomic

        write_json_atomic(
            Path(write_to), {"layout": ctx.layout.to_dict(), "export_error": ctx.export_error, "tensors": digests}
        )
        return make_verdict(NAME, checked=len(digests), findings=[])
    if reference is None:
        return make_verdict(
            NAME,
            checked=0,
            findings=[
                Finding(
                    tensor="<layout>",
                    kind="no-reference",
                    message=f"no TP1 manifest (set {ENV_MANIFEST}; `convcheck verify` does it)",
                )
            ],
        )
    findings = compare(ctx, digests, reference, kept)
    bad = {f.tensor for f in findings}
    rows = tuple(
        TensorRow(tensor=n, shape=tuple(d["shape"]), dtype=d["dtype"], verdict="fail" if n in bad else "pass")
        for n, d in sorted(digests.items())
    )
    return make_verdict(NAME, checked=len(digests), findings=findings, rows=rows)


def compare(
    ctx: RankContext, digests: dict[str, dict[str, Any]], reference: dict[str, Any], kept: dict[str, Any]
) -> list[Finding]:
    """Findings for tensors whose digest differs from the TP1 manifest or the source (named, with first index)."""
    from convcheck.bits import compare_bits
    from convcheck.checkpoint import TensorReader
    from convcheck.diagnose import diagnose, sibling_names

    findings: list[Finding] = []
    ref = reference.get("tensors", {})
    reader = TensorReader(ctx.checkpoint)
    source = ctx.checkpoint.tensors
    if ctx.export_error:
        findings.append(
            Finding(
                tensor="<export>", kind="export-failed", message=f"bridge.export_hf_weights raised {ctx.export_error}"
            )
        )
    if reference.get("export_error"):
        findings.append(
            Finding(
                tensor="<export>",
                kind="tp1-export-failed",
                message=f"the TP1 export raised {reference['export_error']}",
            )
        )
    for name in sorted(set(ref) & set(source)):
        if digest(reader.get(name)) != ref[name]:
            findings.append(
                Finding(
                    tensor=name,
                    kind="tp1-differs-from-source",
                    message="the TP1 export of this tensor differs from the source bytes (see roundtrip at TP1)",
                )
            )
    for name in sorted(set(ref) - set(digests)):
        findings.append(
            Finding(tensor=name, kind="missing", message=f"in the TP1 export, not in the {ctx.layout.label} export")
        )
    for name in sorted(set(digests) - set(ref)):
        findings.append(
            Finding(tensor=name, kind="extra", message=f"in the {ctx.layout.label} export, not in the TP1 export")
        )
    first_differing = None
    for name in sorted(set(digests) & set(ref)):
        if digests[name] == ref[name]:
            continue
        first_differing = first_differing or name
        message = f"differs from the TP1 export ({_brief(digests[name])} vs TP1 {_brief(ref[name])})"
        detail: dict[str, Any] = {"layout": digest_cmp(digests[name], ref[name])}
        if name in source:
            tensor = kept.get(name)
            src = reader.get(name)
            if tensor is not None:
                against = compare_bits(name, src, tensor)
                if against is not None:
                    message += f"; against the source: {against.message}"
                    detail.update({k: v for k, v in against.detail.items() if k in ("first_index", "count")})
                    others = {n: reader.get(n) for n in sibling_names(name, list(source))}
                    found = diagnose(name, src, tensor, others)
                    if found is not None:
                        message += f"; diagnosis: {found.text}"
                        detail["diagnosis"] = found.text
                else:
                    message += "; equals the source (the TP1 export is the one that differs)"
        findings.append(Finding(tensor=name, kind="layout-differs", message=message, detail=detail))
    if first_differing is not None:
        findings.append(
            Finding(
                tensor="<layout>",
                kind="first-differing",
                message=f"first tensor that differs from the TP1 export: {first_differing}",
                detail={"tensor": first_differing},
            )
        )
    return findings


def digest_cmp(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Which of dtype / shape / bytes differ."""
    return [k for k in ("dtype", "shape", "sha256") if a.get(k) != b.get(k)]


def _brief(d: dict[str, Any]) -> str:
    return f"{d['dtype']} {d['shape']} sha256 {d['sha256'][:12]}"


def reference_manifest(job: Any, log_dir: str | None = None) -> Path:
    """Run (or reuse from the cache) the 1-rank TP1 job that writes the digest manifest for `job`'s checkpoint."""
    from convcheck.engine.launch import run_ranks
    from convcheck.layout import ParallelLayout
    from convcheck.versions import versions

    key = hashlib.sha256()
    key.update(
        json.dumps(
            {"model": job.model_path, "hooks": list(job.hooks), "device": job.device, "options": job.options, "v": versions()}, sort_keys=True
        ).encode()
    )
    for path in sorted(Path(job.model_path).glob("*.safetensors")) + [
        Path(h.rpartition(":")[0]) for h in job.hooks if h.rpartition(":")[0].endswith(".py")
    ]:
        stat = path.stat()
        key.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    cache = Path(os.environ.get("CONVCHECK_CACHE_DIR", Path.home() / ".cache" / "convcheck")) / "layout"
    cache.mkdir(parents=True, exist_ok=True)
    manifest = cache / f"{key.hexdigest()[:24]}.json"
    if manifest.is_file():
        return manifest
    ref_job = replace(job, layout=ParallelLayout(tp=1, pp=1, ep=1, etp=1), oracles=(NAME,), workdir=".")
    saved = os.environ.get(ENV_WRITE)
    os.environ[ENV_WRITE] = str(manifest)
    try:
        run_ranks(ref_job, log_dir=str(Path(log_dir) / "layout-tp1") if log_dir else None)
    finally:
        if saved is None:
            os.environ.pop(ENV_WRITE, None)
        else:
            os.environ[ENV_WRITE] = saved
    return manifest
