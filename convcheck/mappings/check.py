"""Pure checks of one mapping: HF -> every rank's shard -> HF (names counted, bits compared), and one shard against
what the mapping derives for it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from convcheck.compare.bits import bytes_equal, compare_bits, same_tensor
from convcheck.compare.proven import ProvenBytes
from convcheck.errors import MappingError
from convcheck.layout import ParallelLayout, RankCoord
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


def shard_matches(
    mapping: TensorMapping,
    hf: Mapping[str, Any],
    layout: ParallelLayout,
    coord: RankCoord,
    shard: Any,
    proven: ProvenBytes | None = None,
) -> bool:
    """True when the shard is what the mapping derives from `hf`: its row blocks, or else its whole `to_shard`,
    equal the shard bitwise (a MappingError is False): exactly when the mapping oracle's import check finds nothing.
    Byte ranges `proven` (convcheck.compare.proven.ProvenBytes) holds as equal are not read again."""
    try:
        return rows_match(mapping, hf, layout, coord, shard, proven) or same_tensor(
            mapping.to_shard(hf, layout, coord), shard.detach(), proven
        )
    except MappingError:
        return False


def rows_match(
    mapping: Any,
    hf: Mapping[str, Any],
    layout: ParallelLayout,
    coord: RankCoord,
    shard: Any,
    proven: ProvenBytes | None = None,
) -> bool:
    """True when the mapping gives the shard as row blocks (`row_pieces`) and each equals the shard's rows bitwise;
    False sends the shard to the whole-tensor compare, which names the first wrong element."""
    pieces = getattr(mapping, "row_pieces", None)
    if pieces is None:
        return False
    blocks, row = pieces(hf, layout, coord), 0
    if blocks is None or shard.dim() == 0 or sum(b.shape[0] for b in blocks) != shard.shape[0]:
        return False
    whole = shard.detach()
    dtype, tail, stride, start = whole.dtype, whole.shape[1:], whole.stride(), whole.data_ptr()
    step = stride[0] * whole.element_size()
    for block in blocks:
        rows = block.shape[0]
        if block.dtype != dtype or block.shape[1:] != tail:
            return False
        in_place = block.data_ptr() == start + row * step and block.stride() == stride and block.device == whole.device
        if not in_place:  # else the very rows `whole.narrow(0, row, rows)` names: equal without reading them
            part = whole if rows == whole.shape[0] else whole.narrow(0, row, rows)
            if not bytes_equal(block, part, proven):
                return False
        row += rows
    return True
