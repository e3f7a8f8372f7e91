"""Pure round-trip check of one mapping: HF -> every rank's shard -> HF, names counted and bits compared."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from convcheck.bits import compare_bits
from convcheck.layout import ParallelLayout
from convcheck.mappings.base import TensorMapping
from convcheck.verdict import Finding


def roundtrip_findings(mapping: TensorMapping, hf: Mapping[str, Any], layout: ParallelLayout) -> list[Finding]:
    """Findings (missing / duplicate / unexpected HF name, bytes-differ) of `from_shards(to_shard(hf))` vs `hf`."""
    shards = {c: mapping.to_shard(hf, layout, c) for c in mapping.coords(layout)}
    findings: list[Finding] = []
    counts: Counter[str] = Counter()
    for name, tensor in mapping.from_shards(shards, layout):
        counts[name] += 1
        if counts[name] > 1:
            continue
        if name not in hf:
            message = f"{mapping.megatron} exported a name the source lacks"
            findings.append(Finding(tensor=name, kind="unexpected", message=message))
            continue
        finding = compare_bits(name, hf[name], tensor)
        if finding is not None:
            findings.append(finding)
    for name in mapping.hf_names:
        if counts[name] == 0:
            findings.append(Finding(tensor=name, kind="missing", message=f"{mapping.megatron} never exported it"))
        elif counts[name] > 1:
            message = f"{mapping.megatron} exported it {counts[name]} times"
            findings.append(Finding(tensor=name, kind="duplicate", message=message))
    return sorted(findings, key=lambda f: (f.tensor, f.kind))
