"""The pure checks of a folder a writer made from a source checkpoint: shards and index, which source shard each
tensor landed in, and every tensor's dtype, shape and bytes (or, with a cast, the exact cast of the source).

Streamed like `convcheck sweep`: headers are parsed up front, tensor bytes are compared one memory-mapped window at a
time, a cast check loads one source tensor at a time. Findings name the file and the tensor.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import torch

from convcheck.ckpt.folder import check_index, shard_tensors
from convcheck.compare.bits import compare_bits
from convcheck.hf.checkpoint import INDEX_NAME, SINGLE_NAME, Checkpoint, TensorEntry
from convcheck.hf.sweep import Side, compare
from convcheck.hf.tensors import TensorReader
from convcheck.verdict import Finding

CAST_DTYPES = {"bf16": ("BF16", "bfloat16"), "fp16": ("F16", "float16"), "fp32": ("F32", "float32")}
"""`--save-dtype` spellings -> (safetensors dtype, torch dtype) of the bridge's `weight_dtype` cast."""
FLOAT_DTYPES = frozenset({"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"})


@dataclass(kw_only=True)
class WrittenReport:
    """What proving one written folder found."""

    checked: int = 0
    """Source tensors compared with what the folder holds."""
    findings: list[Finding] = field(default_factory=list)
    files: int = 0
    """Safetensors files in the folder."""


def prove_written(
    source: Checkpoint,
    folder: Path,
    *,
    label: str,
    cast: str | None = None,
    not_built: Collection[str] = (),
) -> WrittenReport:
    """Every source tensor (but those in `not_built`) stored once, where the source's index put it, with the source's
    dtype, shape and bytes (`cast`: the exact cast of float tensors to that dtype); the index true to the shards."""
    report = WrittenReport()
    written = _written_tensors(folder, label, report)
    if written is None:
        return report
    expected = {name: entry for name, entry in source.tensors.items() if name not in not_built}
    report.findings += _shard_layout(source, expected, written, label)
    report.findings += _stray(source, written, not_built, label)
    out = Checkpoint(path=folder, config={}, tensors=written)
    kept = Checkpoint(path=source.path, config={}, tensors=expected)
    if cast is None:
        swept = compare(Side(label="source", weights=kept), Side(label=label, weights=out))
        report.findings += [_labelled(f, label, written, expected) for f in swept.findings if f.kind != "extra"]
        report.checked = swept.tensors
        return report
    report.checked, found = _cast_findings(kept, out, cast)
    report.findings += [_labelled(f, label, written, expected) for f in found]
    return report


def _written_tensors(folder: Path, label: str, report: WrittenReport) -> dict[str, TensorEntry] | None:
    """The folder's tensors (name -> entry), the index checked against the shards; None when nothing is readable."""
    report.files = len(list(folder.glob("*.safetensors")))
    if (folder / INDEX_NAME).exists():
        structure = check_index(folder, INDEX_NAME)
        report.findings += [_labelled(f, label, structure.tensors) for f in structure.findings]
        return structure.tensors
    if not report.files:
        report.findings.append(
            Finding(tensor="<folder>", kind="no-weights", message=f"{label}: the writer left no safetensors file")
        )
        return None
    out: dict[str, TensorEntry] = {}
    for shard in sorted(p.name for p in folder.glob("*.safetensors")):
        tensors, problem = shard_tensors(folder / shard)
        if problem is not None:
            report.findings.append(_labelled(problem, label, {}))
        for name, entry in tensors.items():
            if name in out:
                message = f"{label}: in two files, {out[name].file} and {shard}"
                report.findings.append(Finding(tensor=name, kind="duplicate", message=message))
            out.setdefault(name, entry)
    return out


def _shard_layout(
    source: Checkpoint, expected: dict[str, TensorEntry], written: dict[str, TensorEntry], label: str
) -> list[Finding]:
    """The writer promises the source's layout: each tensor in the file the source's index names (one
    model.safetensors for a source without an index); a source shard with no tensor written is named once."""
    sharded = (source.path / INDEX_NAME).exists()
    findings = []
    landed: dict[str, int] = {}
    for name, entry in sorted(expected.items()):
        held = written.get(name)
        if held is None:
            continue
        landed[entry.file] = landed.get(entry.file, 0) + 1
        want = entry.file if sharded else SINGLE_NAME
        if held.file != want:
            message = f"{label}: written to {held.file}; the source keeps it in {entry.file}"
            findings.append(Finding(tensor=name, kind="shard-moved", message=message, detail={"file": held.file}))
    for shard in sorted({e.file for e in expected.values()} - set(landed)):
        count = sum(1 for e in expected.values() if e.file == shard)
        message = f"{label}: none of the source shard's {count} tensors was written (the shard is dropped)"
        findings.append(Finding(tensor=shard, kind="shard-dropped", message=message, detail={"tensors": count}))
    return findings


def _stray(
    source: Checkpoint, written: dict[str, TensorEntry], not_built: Collection[str], label: str
) -> list[Finding]:
    """Tensors the folder holds that the source has not, or that the model does not build (named by file)."""
    out = []
    for name in sorted(set(written) - set(source.tensors)):
        message = f"{label}: stored in {written[name].file}; the source has no tensor of this name"
        out.append(Finding(tensor=name, kind="extra", message=message, detail={"file": written[name].file}))
    for name in sorted(set(written) & set(not_built)):
        message = f"{label}: stored in {written[name].file}, though the model does not build it"
        out.append(Finding(tensor=name, kind="not-built-written", message=message))
    return out


def _cast_findings(source: Checkpoint, out: Checkpoint, cast: str) -> tuple[int, list[Finding]]:
    """(tensors compared, findings): float tensors are exactly `source.to(cast)`, the others unchanged, one at a
    time."""
    torch_dtype = CAST_DTYPES[cast][1]
    findings: list[Finding] = []
    checked = 0
    src, dst = TensorReader(source), TensorReader(out)
    for name in sorted(source.tensors):
        entry = source.tensors[name]
        if name not in out.tensors:
            message = f"not written; the source holds it ({entry.dtype} {list(entry.shape)}, {entry.file})"
            findings.append(Finding(tensor=name, kind="missing", message=message))
            continue
        checked += 1
        want = src.get(name)
        if entry.dtype in FLOAT_DTYPES:
            want = want.to(getattr(torch, torch_dtype))
        found = compare_bits(name, want, dst.get(name))
        if found is not None:
            findings.append(found)
    return checked, findings


def _labelled(
    finding: Finding, label: str, written: dict[str, TensorEntry], source: dict[str, TensorEntry] | None = None
) -> Finding:
    """The finding with the variant's label and the file it concerns in front of its message (for a tensor the folder
    lacks: the source's file)."""
    if finding.message.startswith(f"{label}:"):
        return finding
    entry = written.get(finding.tensor)
    kept = (source or {}).get(finding.tensor)
    where = f" in {entry.file}" if entry is not None else f" (the source keeps it in {kept.file})" if kept else ""
    return Finding(
        tensor=finding.tensor,
        kind=finding.kind,
        message=f"{label}{where}: {finding.message}",
        detail=finding.detail,
    )
