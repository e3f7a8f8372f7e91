"""Quant oracle: the bridge's quantized export (export_hf_weights_quant) is, byte for byte, the named quantizer applied
to the bridge's bf16 export of each whole HF tensor, with every scale it needs, on the names the target quantizes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from convcheck.errors import BadInput, one_line, raised_at
from convcheck.oracles import ORACLES
from convcheck.oracles.base import option_values
from convcheck.quant.catalog import is_custom
from convcheck.quant.names import QuantTarget, expected_quantized, target_from_config
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "quant"


INFO = ORACLES[NAME]
SCALE_SUFFIX = "weight_scale_inv"
"""What export_hf_weights_quant names every scale (`<hf name>_scale_inv`, param_mapping.py:1096 and its siblings)."""


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank drains the bf16 export (unless an earlier drain proved it equals the source) and the
    quantized export; each rank checks its share of the names (every rank receives every tensor); rank 0 reports."""
    from convcheck.quant.check import QuantCheck
    from convcheck.quant.quantizer import load_quantizer
    from convcheck.quant.reuse import BlockReuse

    started = time.perf_counter()
    options = option_values(INFO, ctx.oracle_options(NAME))
    quantizer = load_quantizer(options["quantizer"], options["quant_block"])
    target = _target(ctx, options["quant_config"])
    if not quantizer.bridge:
        reason = (f"{quantizer.label} sends {len(quantizer.scales)} scales per weight ("
                  f"{', '.join(s for s, _ in quantizer.scales)}); export_hf_weights_quant's quant_fn returns one, and "
                  "the bridge's NVFP4 path (export_hf_weights_modelopt) needs a ModelOpt-quantized model, which "
                  "convcheck does not build yet")  # fmt: skip
        return make_verdict(NAME, checked=0, findings=[], not_covered=reason) if ctx.is_reporter else None
    _check_blocks(ctx, quantizer.block, target)
    why_not = expected_quantized({n: e.shape for n, e in ctx.checkpoint.tensors.items()}, target)
    every_bound = options["quant_bound"] == "every" or is_custom(options["quantizer"])
    storages = frozenset(t.untyped_storage().data_ptr() for _, t in ctx.named_parameters())
    if quantizer.reusable:
        quantizer = replace(quantizer, reuse=BlockReuse(block=quantizer.block))
    check = QuantCheck(quantizer=quantizer, target=target, why_not=why_not, rank=ctx.rank, world=ctx.world,
                       suffix=(SCALE_SUFFIX,), checkpoint=ctx.checkpoint, model_storages=storages,
                       bound_every=every_bound, reuse=quantizer.reuse)  # fmt: skip
    seconds: dict[str, float] = {}
    bf16 = _reference(ctx, check)
    seconds["bf16_and_reference"] = time.perf_counter() - started
    t0 = time.perf_counter()
    error = _quantized(ctx, check, quantizer, why_not)
    kept = quantizer.reuse.keep_s if quantizer.reuse is not None else 0.0
    seconds["quantized_export"] = time.perf_counter() - t0 - kept
    seconds["kept_for_reuse"] = kept
    t0 = time.perf_counter()
    every: list[Share] = ctx.gather(Share(findings=check.finish(), checked=check.checked, worst=check.worst,
                                          max_error=check.max_error, error=error, cpu=check.cpu,
                                          bounded=check.bounded, calls=quantizer.calls,
                                          reused=quantizer.reuse.hits if quantizer.reuse else 0))  # fmt: skip
    if not ctx.is_reporter:
        return None
    findings = [f for share in every for f in share.findings]
    if bf16 is not None:
        findings.append(bf16)
    calls = {key: sum(share.calls[key] for share in every) for key in ("total", "autograd")}
    if calls["autograd"]:
        findings.append(_autograd_finding(calls))
    errors = sorted({share.error for share in every if share.error})
    findings += [Finding(tensor="<quantized export>", kind="export-failed",
                         message=f"bridge.export_hf_weights_quant raised {e}") for e in errors]  # fmt: skip
    seconds["compare"] = time.perf_counter() - t0
    quantized = sum(1 for why in why_not.values() if not why)
    metrics: dict[str, Any] = {
        "quantizer": quantizer.label,
        "target": target.source,
        "quantized_weights": quantized,
        "bf16_from": check.bf16_from,
        "worst_error_over_bound": round(max(share.worst for share in every), 4),
        "bound_measured_on": f"{sum(share.bounded for share in every)} of {quantized} quantized tensors"
        + ("" if every_bound else " (the first 128 rows of the first of each shape and dtype on each rank)"),
        "max_abs_error": max(share.max_error for share in every),
        "references_reused": sum(share.reused for share in every),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "cpu_seconds_per_rank": {k: [round(share.cpu[k], 3) for share in every] for k in check.cpu},
    }
    return make_verdict(NAME, checked=sum(share.checked for share in every), findings=findings, metrics=metrics,
                        seconds=time.perf_counter() - started)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Share:
    """What one rank found over its share of the names, gathered to rank 0."""

    findings: list[Finding]
    checked: int
    worst: float
    """The largest |dequantize(q) - x| / bound it measured."""
    max_error: float
    error: str
    """One line when the quantized export raised on this rank, else ""."""
    cpu: dict[str, float]
    bounded: int
    calls: dict[str, int]
    """The bridge's quant_fn calls: all, and those with autograd on (convcheck.quant.quantizer.Quantizer.calls)."""
    reused: int = 0
    """References assembled from the quantized export's own results (convcheck.quant.reuse)."""


def _autograd_finding(calls: dict[str, int]) -> Finding:
    """The finding for a bridge that called quant_fn with autograd on and a parameter that requires grad."""
    return Finding(
        tensor="<quantized export>",
        kind="quant-fn-autograd",
        message=f"the bridge called quant_fn {calls['autograd']} of {calls['total']} times (all ranks) with autograd "
        "on and a weight that requires grad: a quant_fn of plain torch ops returns tensors whose graphs hold its "
        "float32 steps (this oracle's quant_fn runs under no_grad)",
        detail=dict(calls),
    )


def _target(ctx: RankContext, config_file: str | None) -> QuantTarget:
    """The rollout's quantization_config: --quant-config, else the checkpoint's own, else the default."""
    if config_file:
        data = json.loads(Path(config_file).read_text())
        return target_from_config(data.get("quantization_config", data), config_file)
    own = ctx.checkpoint.config.get("quantization_config")
    if own:
        return target_from_config(own, f"{ctx.checkpoint.path}/config.json")
    return target_from_config(None, "default: every 2-D weight but the embedding, LM head and routers")


def _check_blocks(ctx: RankContext, block: tuple[int, int], target: QuantTarget) -> None:
    """BadInput (exit 2) where the block is not the target's or the bridge's quantized export refuses it: whole blocks
    in each head (param_mapping.py:1809), across the hidden size (:1812) and in each gate/up shard (:2752)."""
    if target.block is not None and target.block != block:
        raise BadInput(f"the target's weight_block_size {list(target.block)} ({target.source}) is not the quantizer's "
                       f"block {list(block)}: give --quant-block {target.block[-1]}")  # fmt: skip
    config, names = ctx.checkpoint.config, ctx.checkpoint.tensors
    hidden = int(config.get("hidden_size", 0))
    heads = int(config.get("num_attention_heads", 1) or 1)
    widths = {"hidden_size": (hidden, 1)}
    if any(".self_attn.q_proj." in n for n in names):
        widths["head_dim"] = (int(config.get("head_dim") or hidden // heads), 0)
    if any(".mlp.gate_proj." in n and ".experts." not in n for n in names):
        widths[f"intermediate_size / TP{ctx.layout.tp}"] = (int(config.get("intermediate_size", 0)) // ctx.layout.tp, 0)
    if any(".experts." in n and n.endswith("gate_proj.weight") for n in names):
        size = int(config.get("moe_intermediate_size", 0)) // ctx.layout.etp
        widths[f"moe_intermediate_size / ETP{ctx.layout.etp}"] = (size, 0)
    for label, (width, axis) in widths.items():
        if width % block[axis]:
            raise BadInput(f"the quantization block {list(block)} does not divide the checkpoint's {label} = {width}: "
                           "the bridge's quantized export needs whole blocks in every shard")  # fmt: skip


def _reference(ctx: RankContext, check: Any) -> Finding | None:
    """Feed `check` the bf16 tensors: from the source where an earlier drain proved the export equals it on every
    rank, else from a drain of the bridge's bf16 export (its failure, if any, on rank 0)."""
    proven = ctx.exports.source_match
    total = len(ctx.checkpoint.tensors)
    ctx.phase = f"{NAME}: bf16 reference"
    if proven is not None and proven.clean:
        check.bf16_from = f"the source (the export proven equal to it by {proven.by})"
        for done, name in enumerate(sorted(ctx.checkpoint.tensors), 1):
            check.offer_source(name)
            ctx.progress.emit(ctx.phase, done=done, total=total, unit="tensors")
        return None
    check.bf16_from = "a drain of the bridge's bf16 export"
    for name, tensor in ctx.export(cpu=ctx.device != "cuda"):
        check.offer_bf16(name, tensor)
    return ctx.export_failure() if ctx.is_reporter else None


def quantized_stream(ctx: RankContext, quantizer: Any, why_not: dict[str, str]) -> Iterator[tuple[str, Any]]:
    """Collective: the bridge's export_hf_weights_quant with `quantizer` as quant_fn and a quantization_checker that
    picks the Megatron parameters whose HF tensors the target all quantizes (`why_not` "" for each)."""
    bridge = ctx.bridge._model_bridge
    tasks = bridge.build_conversion_tasks(ctx.bridge.hf_pretrained, ctx.model)
    chosen = set()
    for task in tasks:
        if task is None:
            continue
        hf = task.mapping.hf_param
        names = list(hf.values()) if isinstance(hf, dict) else [hf]
        if all(why_not.get(str(n)) == "" for n in names):
            chosen.add(str(task.mapping.megatron_param))
    yield from ctx.bridge.export_hf_weights_quant(ctx.model, chosen.__contains__, quantizer.bridge_fn,
                                                  quant_block_size=quantizer.block, cpu=ctx.device != "cuda",
                                                  show_progress=False, conversion_tasks=tasks)  # fmt: skip


def _quantized(ctx: RankContext, check: Any, quantizer: Any, why_not: dict[str, str]) -> str:
    """Drain export_hf_weights_quant into `check`; one line when it raised ("" when it ran to its end)."""
    ctx.phase = f"{NAME}: quantized export"
    total = len(ctx.checkpoint.tensors)
    try:
        for done, (name, tensor) in enumerate(quantized_stream(ctx, quantizer, why_not), 1):
            check.offer_quantized(name, tensor)
            ctx.progress.emit(ctx.phase, done=done, total=total, unit="tensors")
    except Exception as exc:  # noqa: BLE001 - a raising export is a finding, not a crash of convcheck
        return f"{one_line(exc)} at {raised_at(exc)}"
    return ""
