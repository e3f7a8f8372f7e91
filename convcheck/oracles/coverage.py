"""Coverage oracle: strict, two-sided name accounting between the Megatron model and the HF checkpoint."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from convcheck.layout import ParallelLayout, RankCoord
from convcheck.oracles import ORACLES
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, TensorRow, make_verdict

NAME = "coverage"
INFO = ORACLES[NAME]


def _hf_names(mapping: Any) -> list[str]:
    hf = mapping.hf_param
    return [hf] if isinstance(hf, str) else list(hf.values())


def is_expert(name: str, tensor: Any = None) -> bool:
    """A routed-expert parameter: Megatron marks it `allreduce=False`; the bridge's names hold `.experts.`."""
    if ".experts.local_experts." in name or ".experts.linear_fc" in name:
        return True
    return tensor is not None and getattr(tensor, "allreduce", True) is False


def claims(ctx: RankContext) -> dict[str, Any]:
    """What this rank claims: its coordinates and, per global name, how many local tensors and whether expert."""
    counts: Counter[str] = Counter()
    expert: set[str] = set()
    layers: dict[int, set[int]] = {chunk: set() for chunk in range(len(ctx.model))}
    for vp_stage, _, name, tensor in ctx.local_tensors():
        counts[name] += 1
        if is_expert(name, tensor):
            expert.add(name)
        if found := DECODER_LAYER.match(name):
            layers[vp_stage].add(int(found.group(1)))
    mtp = any(name.startswith(MTP_PREFIXES) for name in counts)
    chunks = [sorted(held) for _, held in sorted(layers.items())]
    return {"rank": ctx.rank, "coord": ctx.coord, "counts": dict(counts), "expert": sorted(expert), "mtp": mtp,
            "layers": chunks}  # fmt: skip


DECODER_LAYER = re.compile(r"(?:language_model\.)?decoder\.layers\.(\d+)\.")
"""A global decoder-layer parameter name and its layer number (a vision-language model's language model's too; its
vision tower's blocks are not pipeline layers)."""


def placement(gathered: list[dict[str, Any]], layout: ParallelLayout, num_layers: int) -> list[Finding]:
    """Layers held by a model chunk other than the one `layout` puts them in (a virtual pipeline's interleave or an
    uneven split ignored, or a chunk numbered with another's offset): one finding per misplaced (stage, chunk)."""
    expected = layout.chunk_layers(num_layers)
    findings = []
    for part in gathered:
        stage = part["coord"].pp_rank
        for chunk, held in enumerate(part["layers"]):
            want = list(expected[stage][chunk]) if chunk < len(expected[stage]) else []
            if held == want:
                continue
            wrong = sorted(set(held) ^ set(want))
            message = (
                f"PP stage {stage} chunk {chunk} (rank {part['rank']}) holds decoder layers {held}; "
                f"{layout.label} puts layers {want} there"
            )
            detail = {"tensor": f"decoder.layers.{wrong[0]}", "rank": part["rank"], "held": held, "expected": want}
            findings.append(Finding(tensor="<pipeline>", kind="misplaced-layers", message=message, detail=detail))
    return findings


MTP_PREFIXES = ("mtp.", "language_model.mtp.")
MTP_EMBEDDINGS = ("embedding.word_embeddings.weight", "language_model.embedding.word_embeddings.weight")
"""A stage with MTP layers holds its own copy of the word embeddings (megatron-core builds it there and keeps it in
the embedding group with stage 0's, as for tied embeddings): a legal replica, not a second owner. A vision-language
model (Qwen3.5-VL) holds both under language_model."""


def exactly_once(gathered: list[dict[str, Any]]) -> list[Finding]:
    """Global names claimed outside a legal replica: twice on one rank, by two PP stages, or (experts) two EP ranks.

    Legal copies: a dense parameter on every TP rank and DP replica of its stage (same global name, TP-sharded or
    replicated); an expert parameter on every ETP rank and expert-DP replica of its EP rank; the word embeddings on a
    later stage that holds MTP layers."""
    holders: dict[str, list[tuple[int, RankCoord]]] = {}
    expert: set[str] = set()
    findings = []
    for part in gathered:
        expert.update(part["expert"])
        for name, count in part["counts"].items():
            mtp_replica = name in MTP_EMBEDDINGS and part.get("mtp") and part["coord"].pp_rank > 0
            if not mtp_replica:  # the MTP stage's copy of stage 0's embeddings is not a second owner
                holders.setdefault(name, []).append((part["rank"], part["coord"]))
            if count > 1:
                message = f"{count} local tensors of rank {part['rank']} claim this global name"
                findings.append(
                    Finding(tensor=name, kind="claimed-twice", message=message, detail={"rank": part["rank"]})
                )
    for name, held in sorted(holders.items()):
        if len(held) < 2:
            continue  # one holder is one owner
        axes = ("ep_rank", "pp_rank") if name in expert else ("pp_rank",)
        owners = sorted({tuple(getattr(c, a) for a in axes) for _, c in held})
        if len(owners) < 2:
            continue
        what = "EP rank / PP stage" if name in expert else "PP stage"
        shown = ", ".join("/".join(map(str, o)) for o in owners)
        ranks = sorted(r for r, _ in held)
        message = (
            f"claimed by {len(owners)} different {what} owners ({shown}; ranks {', '.join(map(str, ranks))}): "
            "not a legal replica, so one of them holds another's parameter"
        )
        findings.append(
            Finding(tensor=name, kind="claimed-twice", message=message, detail={"ranks": ranks, "owners": owners})
        )
    return findings


def task_mappings(ctx: RankContext) -> dict[str, Any]:
    """Global name -> bridge mapping, for this rank's parameters the last probed export drain had tasks for: the
    registry's own lookup of that very name (tasks made under another name, a LoRA wrapper's, are left out)."""
    tasks = ctx.exports.export_tasks or ()
    unwrapped = getattr(ctx.bridge._model_bridge, "_get_lora_unwrapped_name", None) if tasks else None
    found = {}
    for task in tasks:
        name = getattr(task, "global_param_name", None)
        if task.param_weight is None or name is None or task.mapping is None:
            continue
        if unwrapped is None or unwrapped(name) == name:
            found[name] = task.mapping
    return found


def megatron_side(ctx: RankContext, known: dict[str, Any] | None = None) -> tuple[set[str], list[Finding]]:
    """This rank's global parameter names and the findings about them (unmapped, missing HF, not loaded); `known`:
    mappings the bridge's registry already gave for some names (task_mappings), the rest are looked up."""
    known = known or {}
    registry = None
    tied = bool(getattr(ctx.model[0].config, "share_embeddings_and_output_weights", False))
    hf_names = set(ctx.checkpoint.tensors)
    names: set[str] = set()
    findings: list[Finding] = []
    for _, _, name, _ in ctx.local_tensors():
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
        mapping = known.get(name)
        if mapping is None:
            registry = registry or ctx.mapping_registry()
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
    on_host = ctx.device == "cpu" or not ctx.names_drain_on_device
    counts: Counter[str] = Counter(name for name, _ in ctx.export(cpu=on_host))
    export_failed = ctx.export_failure()
    names, findings = megatron_side(ctx, task_mappings(ctx))  # after the drain: its tasks answer most lookups
    if (failure := ctx.import_failure()) is not None:
        findings.append(failure)
    if export_failed is not None:
        findings.append(export_failed)
    gathered = ctx.gather((sorted(names), [f.to_dict() for f in findings], claims(ctx)))
    if not ctx.is_reporter:
        return None
    all_names: set[str] = set()
    unique: dict[tuple[str, str], Finding] = {}
    for rank_names, rank_findings, _ in gathered:
        all_names.update(rank_names)
        for f in rank_findings:
            unique.setdefault((f["tensor"], f["kind"]), Finding.from_dict(f))
    source = set(ctx.checkpoint.tensors)
    parts = [c for _, _, c in gathered]
    all_findings = list(unique.values()) + exactly_once(parts) + export_side(counts, source)
    if (
        ctx.layout.vpp > 1 or ctx.layout.uneven or ctx.layout.accounts
    ):  # the split Megatron makes by itself is not convcheck's to re-derive
        all_findings += placement(parts, ctx.layout, int(ctx.model[0].config.num_layers))
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
