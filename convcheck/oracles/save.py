"""Save oracle: the folder the bridge's own HF writer makes from the sharded model is the source checkpoint again.

At the run's layout every rank calls AutoBridge.save_hf_pretrained (rank 0 writes), then save_hf_weights (with
distributed_save where there are several ranks); rank 0 proves each folder against the source, streamed.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from convcheck.ckpt.written import prove_written
from convcheck.hf.checkpoint import Checkpoint
from convcheck.oracles import ORACLES
from convcheck.oracles.base import option_values
from convcheck.oracles.logits import hf_device, vocab_size
from convcheck.oracles.save_files import config_findings, logits_check, tokenizer_findings
from convcheck.oracles.save_write import Variant, Written, offered, plan, write
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "save"
INFO = ORACLES[NAME]
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def not_built(ctx: RankContext) -> frozenset[str]:
    """Source tensors of layers the model does not build: with MTP off, layers numbered past the decoder
    (`model.layers.{N}` with N >= num_layers) and `mtp.*` (the writer may leave them out; nothing else)."""
    config = ctx.model[0].config
    if getattr(config, "mtp_num_layers", None):
        return frozenset()
    layers = int(config.num_layers)
    out = set()
    for name in ctx.checkpoint.tensors:
        match = _LAYER.match(name)
        if name.startswith("mtp.") or (match is not None and int(match.group(1)) >= layers):
            out.add(name)
    return frozenset(out)


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank runs each writer call into a folder rank 0 made; rank 0 proves the folders."""
    started = time.perf_counter()
    variants = plan(ctx.world, option_values(INFO, ctx.oracle_options(NAME))["save_dtype"], offered(ctx.bridge))
    root = Path(ctx.gather(tempfile.mkdtemp(prefix="convcheck-save-") if ctx.is_reporter else None)[0])
    skip = not_built(ctx)
    findings: list[Finding] = []
    metrics: dict[str, object] = {}
    checked = 0
    try:
        for variant in variants:
            ctx.phase = f"{NAME}: {variant.label}"
            ctx.progress.emit(ctx.phase)
            folder = root / variant.folder
            done = write(ctx, variant, folder)
            every = ctx.gather(done)
            if ctx.is_reporter:
                count, found, numbers = _prove(ctx, variant, folder, every, skip)
                checked += count
                findings += found
                metrics[variant.label] = numbers
            _barrier(ctx)
    finally:
        if ctx.is_reporter:
            shutil.rmtree(root, ignore_errors=True)
    if not ctx.is_reporter:
        return None
    if skip:
        metrics["not_built"] = f"{len(skip)} source tensors of layers the model does not build (MTP off)"
    return make_verdict(NAME, checked=checked, findings=findings, seconds=time.perf_counter() - started,
                        metrics=metrics)  # fmt: skip


def _prove(
    ctx: RankContext, variant: Variant, folder: Path, every: list[Written], skip: frozenset[str]
) -> tuple[int, list[Finding], dict[str, object]]:
    """(tensors checked, findings, metrics) of one written folder against the source."""
    source: Checkpoint = ctx.checkpoint
    findings = [
        Finding(tensor="<writer>", kind="writer-raised", message=f"{variant.label} raised on rank {rank}: {w.error}")
        for rank, w in enumerate(every)
        if w.error
    ]
    yielded = set().union(*(w.yielded for w in every))
    numbers: dict[str, object] = {"seconds": round(max(w.seconds for w in every), 3)}
    said = [line for w in every for line in w.said]
    if said:
        numbers["writer_said"] = said[:8]
    if not folder.is_dir():
        findings.append(Finding(tensor="<folder>", kind="no-folder", message=f"{variant.label} made no folder"))
        return 0, findings, numbers
    report = prove_written(source, folder, label=variant.label, cast=variant.cast, not_built=skip)
    findings += [_attributed(f, yielded) for f in report.findings]
    numbers["files"] = report.files
    if variant.method == "save_hf_pretrained":
        findings += config_findings(source.path, folder, variant.label)
        dropped, added = tokenizer_findings(source.path, folder, variant.label)
        findings += dropped
        if added:
            numbers["added_files"] = added
        weights_ok = all(f.kind == "field-differs" for f in findings)  # a config change still gets its logits
        if weights_ok and (folder / "config.json").exists():
            vocab = vocab_size(source.config)  # a vision-language config keeps it in text_config
            device = hf_device(ctx)
            wrong, error = logits_check(source.path, folder, variant.label, vocab, variant.cast is None, device)
            findings += wrong
            numbers["logits_max_abs_error"] = error
    return report.checked, findings, numbers


def _attributed(finding: Finding, yielded: set[str]) -> Finding:
    """A missing tensor says whether the export stream handed it to the writer (the writer dropped it) or not."""
    if finding.kind != "missing":
        return finding
    why = "the export stream yielded it: the writer dropped it" if finding.tensor in yielded else (
        "the export stream never yielded it (see the roundtrip oracle)")  # fmt: skip
    return Finding(tensor=finding.tensor, kind=finding.kind, message=f"{finding.message} ({why})",
                   detail=finding.detail)  # fmt: skip


def _barrier(ctx: RankContext) -> None:
    """Every rank waits until rank 0 has proved the folder (a slow rank 0 must not see the next variant start)."""
    if ctx.world > 1:
        dist.barrier()
