"""Mapping oracle: the bridge's shards and export, compared bitwise with convcheck's own explicit mappings."""

from __future__ import annotations

from typing import Any

from convcheck.bits import compare_bits
from convcheck.checkpoint import TensorReader
from convcheck.engine.context import RankContext
from convcheck.engine.model import named_tensors
from convcheck.mappings import Geometry, MappingError, MappingRegistry, RankCoord, build_registry
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "mapping"


def padded_vocab(provider: Any, vocab: int, tp: int) -> int:
    """The embedding rows the provider builds: the HF vocab, or padded when the provider pads it."""
    if not getattr(provider, "should_pad_vocab", False):
        return vocab
    from megatron.bridge.utils.vocab_utils import calculate_padded_vocab_size

    return int(calculate_padded_vocab_size(vocab, provider.make_vocab_size_divisible_by, tp))


def registry_for(ctx: RankContext, all_names: set[str]) -> MappingRegistry:
    """The explicit registry for this model, built leniently: parameters it does not cover are not checked."""
    config = ctx.checkpoint.config
    vocab = int((config.get("text_config") or config)["vocab_size"])
    geometry = Geometry.from_hf_config(config, padded_vocab=padded_vocab(ctx.provider, vocab, ctx.layout.tp))
    tied = bool(getattr(ctx.model[0].config, "share_embeddings_and_output_weights", False))
    return build_registry(
        ctx.checkpoint.architecture, geometry, all_names, ctx.checkpoint.tensors, tied=tied, strict=False
    )


def _import_findings(ctx: RankContext, registry: MappingRegistry, coord: RankCoord, local: list) -> list[Finding]:
    """Each covered local shard vs `to_shard` of the HF checkpoint for this rank."""
    reader = TensorReader(ctx.checkpoint)
    findings = []
    for name, tensor in local:
        mapping = registry.get(name)
        try:
            hf = {n: reader.get(n) for n in mapping.hf_names if n in ctx.checkpoint.tensors}
            expected = mapping.to_shard(hf, ctx.layout, coord)
        except MappingError as exc:
            findings.append(Finding(tensor=name, kind="mapping-error", message=str(exc), detail={"rank": ctx.rank}))
            continue
        finding = compare_bits(name, expected, tensor.detach().cpu())
        if finding is not None:
            findings.append(
                Finding(
                    tensor=name,
                    kind=f"import-{finding.kind}",
                    message=f"rank {ctx.rank} ({_label(coord)}) shard vs explicit mapping: {finding.message}",
                    detail={**finding.detail, "rank": ctx.rank, "coord": _label(coord)},
                )
            )
    return findings


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank checks its shards; rank 0 rebuilds HF tensors from all shards and checks the export."""
    coord = ctx.coord
    local = [(ctx.global_name(n, vp), t) for vp, n, t in named_tensors(ctx.model)]
    all_names = {n for names in ctx.gather(sorted(n for n, _ in local)) for n in names}
    try:
        registry = registry_for(ctx, all_names)
    except MappingError as exc:  # same on every rank (same config), so no rank is left in a collective
        finding = Finding(tensor="<registry>", kind="no-mappings", message=str(exc))
        return make_verdict(NAME, checked=0, findings=[finding]) if ctx.is_reporter else None
    covered = [(n, t) for n, t in local if registry.get(n) is not None]
    findings = _import_findings(ctx, registry, coord, covered)
    shards = {n: (registry.get(n).canonical(coord), t.detach().cpu()) for n, t in covered}  # type: ignore[union-attr]
    gathered = ctx.gather(([f.to_dict() for f in findings], shards))
    ours: dict[str, tuple[str, Any]] = {}
    if ctx.is_reporter:
        findings, ours = _rebuild(ctx, registry, gathered)
    checked_exports: set[str] = set()
    for hf_name, tensor in ctx.export():
        if not ctx.is_reporter or hf_name not in ours:
            continue
        megatron, expected = ours[hf_name]
        checked_exports.add(hf_name)
        finding = compare_bits(hf_name, expected, tensor)
        if finding is not None:
            findings.append(
                Finding(
                    tensor=hf_name,
                    kind=f"export-{finding.kind}",
                    message=f"bridge export vs explicit mapping of {megatron}: {finding.message}",
                    detail={**finding.detail, "megatron": megatron},
                )
            )
    if not ctx.is_reporter:
        return None
    for hf_name in sorted(set(ours) - checked_exports):
        findings.append(Finding(tensor=hf_name, kind="not-exported", message="the bridge export never produced it"))
    if ctx.export_error:
        message = f"bridge export raised {ctx.export_error}"
        findings.append(Finding(tensor="<export>", kind="export-failed", message=message))
    bad = {f.tensor for f in findings}
    rows = tuple(
        TensorRow(tensor=n, shape=(), dtype="?", verdict=_row_verdict(n, registry, bad)) for n in sorted(all_names)
    )
    covered_count = sum(1 for n in all_names if registry.get(n) is not None)
    return make_verdict(NAME, checked=covered_count + len(checked_exports), findings=findings, rows=rows)


def _rebuild(
    ctx: RankContext, registry: MappingRegistry, gathered: list[Any]
) -> tuple[list[Finding], dict[str, tuple[str, Any]]]:
    """Rank 0: every rank's findings, and HF name -> (Megatron name, tensor) rebuilt by `from_shards`."""
    findings = [Finding.from_dict(f) for rank_findings, _ in gathered for f in rank_findings]
    by_param: dict[str, dict[RankCoord, Any]] = {}
    for _, rank_shards in gathered:
        for name, (coord, tensor) in rank_shards.items():
            by_param.setdefault(name, {}).setdefault(coord, tensor)
    ours: dict[str, tuple[str, Any]] = {}
    for name in sorted(by_param):
        if name in registry.copies:
            continue
        try:
            mapping = registry.get(name)
            for hf_name, tensor in mapping.from_shards(by_param[name], ctx.layout):  # type: ignore[union-attr]
                ours[hf_name] = (name, tensor)
        except MappingError as exc:
            findings.append(Finding(tensor=name, kind="mapping-error", message=str(exc)))
    return findings, ours


def _row_verdict(name: str, registry: MappingRegistry, bad: set[str]) -> str:
    if registry.get(name) is None:
        return "uncovered"
    return "fail" if name in bad else "pass"


def _label(coord: RankCoord) -> str:
    return f"tp{coord.tp_rank} ep{coord.ep_rank} etp{coord.etp_rank} pp{coord.pp_rank}"
