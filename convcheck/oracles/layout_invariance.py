"""Layout oracle: the export at the requested layout is byte-identical to a TP1 export and to the source.

Design: a TP1 export needs its own model, so before the main job the engine runs a separate 1-rank job of this
oracle (convcheck.engine.reference) whose context carries `write_manifest`; it writes a digest manifest (per
tensor: dtype, shape, sha256 of raw bytes). The main job's context carries `reference_manifest`; rank 0 digests
its own export and names every tensor that differs; a differing tensor is then compared with the source bytes
(first differing index, and the rearrangement from convcheck.diagnose when one explains it).
The reference job also records per tensor whether its bytes equal the source (`source`), so the main job hashes only
its own export, on worker threads (convcheck.hashpool); a 1-rank run is its own reference and hashes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from convcheck.oracles.base import OracleInfo
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "layout"
INFO = OracleInfo(
    name=NAME,
    proves="the export at the requested layout is byte-identical, tensor by tensor, to a TP1 export of the "
    "same checkpoint (digest manifest from a separate 1-rank job; a 1-rank run is its own reference) and to the "
    "source",
    does_not_prove="that a bug present identically at every layout (including TP1) is absent (see roundtrip)",
)


def digest(tensor: Any) -> dict[str, Any]:
    """dtype, shape and sha256 of the raw bytes of one tensor."""
    from convcheck.bits import tensor_sha256

    return {
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "sha256": tensor_sha256(tensor),
    }


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains the export; rank 0 writes the manifest (reference job) or compares with it."""
    write_to = ctx.write_manifest
    ref_path = ctx.reference_manifest
    reference = json.loads(Path(ref_path).read_text()) if ref_path and Path(ref_path).is_file() else None
    ref = (reference or {}).get("tensors", {})
    self_reference = reference is None and not write_to and ctx.layout.world_size == 1
    digests, kept = _digest_export(ctx, ref, hashed=not self_reference, against_source=bool(write_to))
    if not ctx.is_reporter:
        return None
    if write_to:
        from convcheck.atomic import write_json_atomic
        from convcheck.sources import loaded_sources

        manifest = {"layout": ctx.layout.to_dict(), "export_error": ctx.export_error, "tensors": digests}
        write_json_atomic(Path(write_to), {**manifest, "sources": loaded_sources()})
        return make_verdict(NAME, checked=len(digests), findings=[])
    if self_reference:  # TP1 is the reference layout: nothing to launch, hash or compare
        rows = tuple(TensorRow(tensor=n, shape=tuple(d["shape"]), dtype=d["dtype"], verdict="pass")
                     for n, d in sorted(digests.items()))  # fmt: skip
        return make_verdict(NAME, checked=len(digests), findings=[], rows=rows, metrics={"reference": "this run (TP1)"})
    if reference is None:
        return make_verdict(
            NAME,
            checked=0,
            findings=[
                Finding(
                    tensor="<layout>",
                    kind="no-reference",
                    message="no TP1 manifest (the engine's reference job writes it; `convcheck verify` runs it)",
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
    from convcheck.diagnose import SiblingIndex, diagnose

    findings: list[Finding] = []
    ref = reference.get("tensors", {})
    reader = TensorReader(ctx.checkpoint)
    source = ctx.checkpoint.tensors
    if (failure := ctx.export_failure()) is not None:
        findings.append(failure)
    if reference.get("export_error"):
        findings.append(
            Finding(
                tensor="<export>",
                kind="tp1-export-failed",
                message=f"the TP1 export raised {reference['export_error']}",
            )
        )
    for name in sorted(set(ref) & set(source)):
        recorded = ref[name].get("source")  # older manifests lack it: hash the source then
        if not (recorded if recorded is not None else digest(reader.get(name)) == _bare(ref[name])):
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
    siblings: SiblingIndex | None = None  # built at the first tensor to diagnose
    for name in sorted(set(digests) & set(ref)):
        if _bare(digests[name]) == _bare(ref[name]):
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
                    siblings = siblings or SiblingIndex(source)
                    others = {n: reader.get(n) for n in siblings.siblings(name)}
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


def _digest_export(
    ctx: RankContext, ref: dict[str, Any], hashed: bool, against_source: bool
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Collective: drain the export; rank 0 gets each tensor's digest (hashed on worker threads; only dtype and shape
    when not `hashed`), with `source` (bytes equal to the source tensor) when `against_source`, and a CPU copy of
    every tensor whose digest differs from `ref`."""
    from convcheck.bits import bytes_equal
    from convcheck.checkpoint import TensorReader
    from convcheck.hashpool import HashPool

    kept: dict[str, Any] = {}

    def keep_if_differs(name: str, sha: str, cpu: Any) -> None:
        if name in ref and ref[name].get("sha256") != sha:
            kept[name] = cpu  # only differing tensors are kept, for diagnosis without a rerun

    pool = HashPool(on_done=keep_if_differs) if ctx.is_reporter and hashed else None
    reader = TensorReader(ctx.checkpoint) if ctx.is_reporter and against_source else None
    digests: dict[str, dict[str, Any]] = {}
    for name, tensor in ctx.export():
        if not ctx.is_reporter:
            continue
        digests[name] = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
        if reader is not None and name in ctx.checkpoint.tensors:
            src = reader.get(name)
            same_kind = src.dtype == tensor.dtype and tuple(src.shape) == tuple(tensor.shape)
            digests[name]["source"] = same_kind and bytes_equal(src.to(tensor.device), tensor)
        if pool is not None:
            pool.submit(name, tensor)
    if pool is not None:
        for name, sha in pool.results().items():
            digests[name]["sha256"] = sha
    return digests, kept


def _bare(d: dict[str, Any]) -> dict[str, Any]:
    """A manifest entry without the `source` flag (what two exports must agree on)."""
    return {k: d[k] for k in ("dtype", "shape", "sha256") if k in d}


def digest_cmp(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Which of dtype / shape / bytes differ."""
    return [k for k in ("dtype", "shape", "sha256") if a.get(k) != b.get(k)]


def _brief(d: dict[str, Any]) -> str:
    return f"{d['dtype']} {d['shape']} sha256 {d['sha256'][:12]}"
