"""Coverage oracle: strict, two-sided name accounting between the Megatron model and the HF checkpoint."""

from __future__ import annotations

from collections import Counter
from typing import Any

from convcheck.rank.context import RankContext
from convcheck.rank.model import named_tensors
from convcheck.oracles.base import OracleInfo
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "coverage"
INFO = OracleInfo(
    name=NAME,
    proves="every Megatron parameter and persistent buffer has a bridge mapping whose HF tensors exist, "
                "every element was written by the import, and the export produces every source tensor exactly "
                "once with no extra names",
    does_not_prove="that any value landed in the right place (see roundtrip)",
)


def _hf_names(mapping: Any) -> list[str]:
    hf = mapping.hf_param
    return [hf] if isinstance(hf, str) else list(hf.values())


def megatron_side(ctx: RankContext) -> tuple[set[str], list[Finding]]:
    """This rank's global parameter names and the findings about them (unmapped, missing HF, not loaded)."""
    registry = ctx.bridge._model_bridge.mapping_registry()
    tied = bool(getattr(ctx.model[0].config, "share_embeddings_and_output_weights", False))
    hf_names = set(ctx.checkpoint.tensors)
    names: set[str] = set()
    findings: list[Finding] = []
    for vp_stage, local, _ in named_tensors(ctx.model):
        name = ctx.global_name(local, vp_stage)
        names.add(name)
        if name in ctx.not_loaded:
            findings.append(
                Finding(
                    tensor=name,
                    kind="not-loaded",
                    message=f"{ctx.not_loaded[name]} elements kept their pre-load value on rank {ctx.rank} "
                    "(the import never wrote them)",
                    detail={"rank": ctx.rank, "count": ctx.not_loaded[name]},
                )
            )
        if tied and name.endswith("output_layer.weight"):
            continue  # tied to the word embeddings: exported under the embedding's mapping
        mapping = registry.megatron_to_hf_lookup(name)
        if mapping is None:
            findings.append(Finding(tensor=name, kind="unmapped", message="Megatron parameter has no bridge mapping"))
            continue
        if getattr(mapping, "allow_hf_name_mismatch", False):
            continue
        for hf in _hf_names(mapping):
            if hf not in hf_names:
                findings.append(
                    Finding(
                        tensor=name,
                        kind="hf-missing",
                        message=f"mapped to HF tensor {hf!r}, which the checkpoint does not contain",
                        detail={"hf": hf},
                    )
                )
    return names, findings


def export_side(counts: Counter[str], source: set[str]) -> list[Finding]:
    """Findings about export names: never produced, produced twice, or not in the source."""
    findings = []
    for name in sorted(source - set(counts)):
        findings.append(
            Finding(tensor=name, kind="not-exported", message="source tensor is never produced by the export")
        )
    for name, count in sorted(counts.items()):
        if count > 1:
            findings.append(Finding(tensor=name, kind="duplicate", message=f"exported {count} times"))
        if name not in source:
            findings.append(
                Finding(tensor=name, kind="unexpected", message="exported but not in the source checkpoint")
            )
    return findings


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank checks its parameters; rank 0 also counts the export's names."""
    names, findings = megatron_side(ctx)
    if (failure := ctx.import_failure()) is not None:
        findings.append(failure)
    counts: Counter[str] = Counter(name for name, _ in ctx.export())
    if (failure := ctx.export_failure()) is not None:
        findings.append(failure)
    gathered = ctx.gather((sorted(names), [f.to_dict() for f in findings]))
    if not ctx.is_reporter:
        return None
    all_names: set[str] = set()
    unique: dict[tuple[str, str], Finding] = {}
    for rank_names, rank_findings in gathered:
        all_names.update(rank_names)
        for f in rank_findings:
            unique.setdefault((f["tensor"], f["kind"]), Finding.from_dict(f))
    source = set(ctx.checkpoint.tensors)
    all_findings = list(unique.values()) + export_side(counts, source)
    bad = {f.tensor for f in all_findings}
    rows = tuple(
        TensorRow(
            tensor=name,
            shape=ctx.checkpoint.tensors[name].shape if name in source else (),
            dtype=ctx.checkpoint.tensors[name].torch_dtype if name in source else "?",
            verdict="fail" if name in bad else "pass",
        )
        for name in sorted(source | set(counts))
    )
    hf_count = len(source | set(counts))
    unit = f"names ({hf_count} HF tensors + {len(all_names)} Megatron parameters)"
    return make_verdict(NAME, checked=len(all_names) + hf_count, findings=all_findings, rows=rows, unit=unit)
