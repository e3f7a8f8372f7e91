"""Name the one cause behind many findings (a checkpoint saved in a layout the bridge does not read, ...)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from convcheck.hf.checkpoint import open_checkpoint
from convcheck.verdict import OracleVerdict

_FUSED_EXPERTS = re.compile(r"(^|\.)experts\.(gate_up_proj|down_proj|w13|w2|w1|w3)(\.weight)?$")


def fused_experts(names: Iterable[str]) -> list[str]:
    """HF tensor names that hold all of a layer's experts in one tensor (`mlp.experts.gate_up_proj` [E, 2F, H])."""
    return sorted(n for n in names if _FUSED_EXPERTS.search(n))


def explain(model_path: str, verdicts: Iterable[OracleVerdict]) -> list[str]:
    """One line per recognised cause of failing findings (empty when everything passed or nothing is recognised)."""
    failing = [v for v in verdicts if v.findings]
    if not failing:
        return []

    try:
        names = list(open_checkpoint(model_path).tensors)
    except Exception:  # noqa: BLE001 - the run already read it; an explanation must never fail the report
        return []
    out = []
    fused = fused_experts(names)
    unread = any(f.kind == "hf-missing" and ".experts." in f.message for v in failing for f in v.findings)
    if fused and unread:  # the bridge maps per-expert names the checkpoint lacks (not a bridge that reads fused)
        count = sum(len(v.findings) for v in failing)
        out.append(
            f"the checkpoint stores MoE experts fused ({len(fused)} tensors such as {fused[0]}, one tensor for all "
            f"experts of a layer, as a raw transformers 5 state_dict() does), while the bridge reads one tensor per "
            f"expert (mlp.experts.N.gate_proj.weight ...); save the model with save_pretrained to get the published "
            f"layout — this explains the {count} findings below"
        )
    return out
