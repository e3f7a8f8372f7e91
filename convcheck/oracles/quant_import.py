"""Quant-import oracle: the bridge's import of an FP8 block checkpoint (published layout: float8_e4m3fn `weight` +
float32 `weight_scale_inv` per 128 x 128 block) puts into every Megatron parameter, bitwise, what its import of the
reference dequantization of that checkpoint puts there."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from convcheck.errors import one_line
from convcheck.oracles import ORACLES
from convcheck.oracles.base import option_values
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "quant-import"
BLOCK = 128
"""The published block (DeepSeek-V3, Qwen3-*-FP8): the bridge's dequantizers assume it (quantization_utils.py:21)."""
FP8_DTYPE = "F8_E4M3"
"""How a safetensors header names float8_e4m3fn."""

INFO = ORACLES[NAME]


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: rank 0 writes the FP8 checkpoint and its references; every rank imports each through the bridge
    into its own model chunks and compares its shards; the model's weights are put back after."""
    started = time.perf_counter()
    options = option_values(INFO, ctx.oracle_options(NAME))
    ctx.phase = f"{NAME}: writing the FP8 checkpoint"
    ctx.progress.emit(ctx.phase)
    root = Path(ctx.gather(tempfile.mkdtemp(prefix="convcheck-quant-import-") if ctx.is_reporter else None)[0])
    written: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    findings: list[Finding] = []
    checked = 0
    held = {name: t.detach().clone() for name, t in ctx.named_parameters() if t.is_floating_point()}
    try:
        if ctx.is_reporter:
            written = _write(ctx, root, options["import_quantizer"])
        written = ctx.gather(written)[0]
        seconds["write"] = time.perf_counter() - started
        t0 = time.perf_counter()
        got, error = _load(ctx, written["fp8"])
        expected, ref_error = _load(ctx, written["reference"])
        seconds["imports"] = time.perf_counter() - t0
        mine = _compare(ctx, got, expected) if not (error or ref_error) else []
        unscaled: dict[str, Any] = {}
        if any(ctx.gather(bool(mine))):
            unscaled, _ = _load(ctx, written["unscaled"])
        mine = [_diagnose(f, got, unscaled) for f in mine]
        every = ctx.gather((mine, len(got), error, ref_error))
    finally:
        _restore(ctx, held)
        ctx.gather(None)
        if ctx.is_reporter:
            shutil.rmtree(root, ignore_errors=True)
    if not ctx.is_reporter:
        return None
    for rank, (found, count, error, ref_error) in enumerate(every):
        findings += found
        checked += count
        if error:
            findings.append(Finding(tensor="<fp8 import>", kind="import-failed",
                                    message=f"bridge.load_hf_weights of the FP8 checkpoint raised on rank {rank}: "
                                    f"{error}"))  # fmt: skip
        if ref_error:
            findings.append(Finding(tensor="<reference import>", kind="import-failed",
                                    message=f"bridge.load_hf_weights of the bf16 reference raised on rank {rank}: "
                                    f"{ref_error}"))  # fmt: skip
    metrics = {
        "fp8_from": written["from"],
        "quantized_weights": written["quantized"],
        "block": [BLOCK, BLOCK],
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }
    return make_verdict(NAME, checked=checked, findings=_deduplicated(findings), unit="shards", metrics=metrics,
                        seconds=time.perf_counter() - started)  # fmt: skip


def _write(ctx: RankContext, root: Path, quantizer: str) -> dict[str, Any]:
    """Rank 0: the FP8 checkpoint (the source itself when it is one), its bf16 reference dequantization and its
    "unscaled" reading (bf16(float32(q)), what a loader that ignores the scales gives) as folders under `root`."""
    from convcheck.hf.tensors import TensorReader
    from convcheck.quant import checkpoint as ckpt
    from convcheck.quant import reference as ref
    from convcheck.quant.names import expected_quantized, target_from_config

    source = ctx.checkpoint
    reader = TensorReader(source)
    tensors = {name: reader.get(name) for name in sorted(source.tensors)}
    config = dict(source.config)
    if any(e.dtype == FP8_DTYPE for e in source.tensors.values()):
        fp8_dir, origin = str(source.path), f"the checkpoint itself ({source.path})"
        fp8 = tensors
        reference = {n: t for n, t in tensors.items() if not n.endswith(ckpt.SCALE)}
        pairs = [n for n, t in tensors.items() if t.dtype == torch.float8_e4m3fn and n + ckpt.SCALE in tensors]
        for name in pairs:
            reference[name] = ckpt.dequantize(tensors[name], tensors[name + ckpt.SCALE], BLOCK)
        quantized = len(pairs)
    else:
        target = target_from_config(config.get("quantization_config"), "the checkpoint")
        why_not = expected_quantized({n: tuple(t.shape) for n, t in tensors.items()}, target)
        quantize = ref.fp8_block if quantizer == "fp8-block" else ref.fp8_ue8m0
        fp8, reference = ckpt.fp8_tensors(tensors, why_not, BLOCK, quantize)
        config["quantization_config"] = ckpt.quantization_config(BLOCK, ckpt.not_converted(why_not))
        fp8_dir = str(ckpt.write_checkpoint(source.path, root / "fp8", fp8, config))
        origin = f"the bf16 checkpoint quantized by the {quantizer} reference"
        pairs = [n for n, why in why_not.items() if why == ""]
        quantized = len(pairs)
    plain = {k: v for k, v in config.items() if k != "quantization_config"}
    unscaled = dict(reference)
    for name in pairs:
        unscaled[name] = fp8[name].to(torch.bfloat16)
    return {
        "fp8": fp8_dir,
        "reference": str(ckpt.write_checkpoint(source.path, root / "reference", reference, plain)),
        "unscaled": str(ckpt.write_checkpoint(source.path, root / "unscaled", unscaled, plain)),
        "from": origin,
        "quantized": quantized,
    }


def _load(ctx: RankContext, folder: str) -> tuple[dict[str, Any], str]:
    """Collective: the bridge's import of `folder` into the model; (a copy of every floating-point shard of this rank
    by global name, one line when the import raised)."""
    ctx.phase = f"{NAME}: importing {Path(folder).name}"
    ctx.progress.emit(ctx.phase)
    error = ""
    try:
        ctx.bridge.load_hf_weights(ctx.model, folder)
    except Exception as exc:  # noqa: BLE001 - a raising import is a finding, not a crash of convcheck
        error = one_line(exc)
    return {n: t.detach().clone() for n, t in ctx.named_parameters() if t.is_floating_point()}, error


def _compare(ctx: RankContext, got: dict[str, Any], expected: dict[str, Any]) -> list[Finding]:
    """A `dequant-differs` finding per shard of this rank whose bits differ (first differing element named)."""
    from convcheck.compare.bits import compare_bits

    out = []
    for name in sorted(got):
        found = compare_bits(name, expected[name], got[name])
        if found is not None:
            detail = {**found.detail, "rank": ctx.rank, "hf": _hf_names(ctx, name)}
            out.append(Finding(tensor=name, kind="dequant-differs", detail=detail,
                               message=f"rank {ctx.rank} shard (from {', '.join(detail['hf']) or '?'}): "
                               f"{found.message} (expected: the import of the reference dequantization)"))  # fmt: skip
    return out


def _diagnose(found: Finding, got: dict[str, Any], unscaled: dict[str, Any]) -> Finding:
    """`loaded-unscaled` where the shard is, bitwise, the import of the fp8 values without their scales."""
    from convcheck.compare.bits import compare_bits

    name = found.tensor
    if name in unscaled and compare_bits(name, unscaled[name], got[name]) is None:
        return Finding(tensor=name, kind="loaded-unscaled", detail=found.detail,
                       message=found.message + "; the shard is, bitwise, the fp8 values cast to bf16 without their "
                       "weight_scale_inv: the checkpoint was loaded as if bf16")  # fmt: skip
    return found


def _hf_names(ctx: RankContext, name: str) -> list[str]:
    """The HF tensors the bridge maps Megatron parameter `name` from (empty when its registry has no mapping)."""
    try:
        mapping = ctx.mapping_registry().megatron_to_hf_lookup(name)
    except Exception:  # noqa: BLE001 - only for the message
        return []
    hf = getattr(mapping, "hf_param", None)
    return sorted(hf.values()) if isinstance(hf, dict) else [str(hf)] if hf else []


def _restore(ctx: RankContext, held: dict[str, Any]) -> None:
    """Put back the shards the model held before this oracle's imports (later oracles see the run's own load)."""
    with torch.no_grad():
        for name, tensor in ctx.named_parameters():
            if name in held:
                tensor.copy_(held[name])


def _deduplicated(findings: list[Finding]) -> list[Finding]:
    """One finding per (tensor, kind): a parameter replicated over ranks (TP-replicated norms, EP) is named by the
    first rank that found it, with the ranks that agree counted."""
    first: dict[tuple[str, str], Finding] = {}
    ranks: dict[tuple[str, str], list[int]] = {}
    for f in findings:
        key = (f.tensor, f.kind)
        first.setdefault(key, f)
        ranks.setdefault(key, []).append(f.detail.get("rank", 0))
    return [Finding(tensor=f.tensor, kind=f.kind, message=f.message, detail={**f.detail, "ranks": ranks[key]})
            for key, f in first.items()]  # fmt: skip
