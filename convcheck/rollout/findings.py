"""The engine oracle's findings from what the engine host reports (pure Python: messages, no torch)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from convcheck.hf.geometry import Geometry
from convcheck.rollout.packing import Shapes, engine_name, locate, sources
from convcheck.verdict import Finding

KNOWN_REPAIR = "moe-not-repacked"
"""The finding kind of expert weights that vLLM's skipped CPU prepack explains (the repair cleared them)."""


def _bits(value: int, dtype: str) -> str:
    width = {"bfloat16": 4, "float16": 4, "float32": 8, "float64": 16, "int8": 2, "uint8": 2}.get(dtype, 8)
    return f"0x{value:0{width}x}"


def _packs(feeds: Sequence[str]) -> str:
    """` (packs a, b, c)`, or the first and last of many."""
    if len(feeds) <= 3:
        return f" (packs {', '.join(feeds)})"
    return f" (packs {len(feeds)} HF tensors, {feeds[0]} ... {feeds[-1]})"


def state_findings(
    diffs: Sequence[dict[str, Any]],
    when: str,
    geometry: Geometry,
    hf: Shapes,
    repacked: dict[str, int] | None = None,
    kind: str = "engine-differs",
) -> list[Finding]:
    """One finding per engine tensor that differs from the engine's fresh load of the source: the HF tensors packed
    into it, the first differing element and where it comes from; a packed layer whose packing did not run during the
    sync is named as computing with a stale packed copy."""
    out = []
    for diff in diffs:
        key = diff["name"]
        name = engine_name(key)
        feeds = sources(key, geometry, hf)
        packs = _packs(feeds) if feeds != [name] else ""
        state = "as last packed by the CPU backend" if key.startswith("packed.") else "parameter"
        module = name.rsplit(".", 1)[0]
        stale = key.startswith("packed.") and repacked is not None and repacked.get(module, 0) == 0
        detail = {"engine_tensor": key, "sources": feeds}
        if diff["kind"] == "shape":
            message = f"{state}{packs} {when}: shape/dtype {diff['got']}, the fresh load's {diff['expected']}"
            out.append(Finding(tensor=name, kind="engine-shape", message=message, detail=detail))
            continue
        index = diff["index"]
        expert = (
            " (the engine's prepacked expert layout)" if "experts" in name and "w" in name.rsplit(".", 1)[1] else ""
        )
        where = "" if expert else locate(key, index, geometry, hf)
        dtype = diff["dtype"]
        message = (
            f"{state}{packs} {when}: {diff['count']}/{diff['total']} elements differ from the engine's fresh load; "
            f"first at index {index}{where}{expert}: got {diff['got_value']!r} ({_bits(diff['got_bits'], dtype)}), "
            f"expected {diff['expected_value']!r} ({_bits(diff['expected_bits'], dtype)})"
        )
        if stale:
            message += "; its packing did not run during the sync: the engine computes with a stale packed copy"
        out.append(Finding(tensor=name, kind="stale-packed" if stale else kind, message=message,
                           detail={**detail, "index": index}))  # fmt: skip
    return out


def output_findings(reference: dict[str, Any], now: dict[str, Any], when: str) -> list[Finding]:
    """Prompt logprobs and greedy tokens against the fresh load's, bitwise (same engine, same kernels): the first
    differing position and token of each kind, with how many differ."""
    out = []
    logprob_diffs, token_diffs = [], []
    for p, (ref, got) in enumerate(zip(reference["prompts"], now["prompts"], strict=True)):
        prompt = ref["prompt"]
        for pos, (a, b) in enumerate(zip(ref["prompt_logprobs"], got["prompt_logprobs"], strict=True)):
            if a is not None and (b is None or float(a).hex() != float(b).hex()):
                logprob_diffs.append(f"prompt {p} position {pos} (token {prompt[pos]}): logprob {b!r}, the fresh "
                                     f"load's {a!r}")  # fmt: skip
        for step, (a, b) in enumerate(zip(ref["tokens"], got["tokens"], strict=False)):
            if a != b:
                token_diffs.append(f"prompt {p} generated step {step}: token {b}, the fresh load's {a}")
                break
        else:
            for step, (a, b) in enumerate(zip(ref["token_logprobs"], got["token_logprobs"], strict=False)):
                if float(a).hex() != float(b).hex():
                    logprob_diffs.append(f"prompt {p} generated step {step} (token {ref['tokens'][step]}): logprob "
                                         f"{b!r}, the fresh load's {a!r}")  # fmt: skip
                    break
    if logprob_diffs:
        out.append(Finding(tensor="<outputs>", kind="logprobs-differ",
                           message=f"{len(logprob_diffs)} logprob(s) differ from the engine's fresh load {when}; "
                           f"first: {logprob_diffs[0]}"))  # fmt: skip
    if token_diffs:
        out.append(Finding(tensor="<outputs>", kind="tokens-differ",
                           message=f"greedy tokens differ from the engine's fresh load {when} in {len(token_diffs)} "
                           f"prompt(s); first: {token_diffs[0]}"))  # fmt: skip
    return out


def delivery_findings(received: dict[str, int], expected: Sequence[str], when: str) -> list[Finding]:
    """Every source tensor handed to the engine's receiver exactly once."""
    counts = Counter(received)
    out = []
    missing = [n for n in expected if counts.get(n, 0) == 0]
    twice = [n for n in expected if counts.get(n, 0) > 1]
    if missing:
        out += [Finding(tensor=n, kind="not-delivered", message=f"never handed to the engine {when}") for n in missing]
    if twice:
        out += [Finding(tensor=n, kind="delivered-twice", message=f"handed to the engine {counts[n]} times {when}")
                for n in twice]  # fmt: skip
    return out


def poison_findings(reference: dict[str, Any], poisoned: dict[str, Any]) -> list[Finding]:
    """The poison (every checkpoint tensor sign-flipped, through the engine's own reload_weights) must reach every
    tensor the engine computes with and change its outputs; otherwise a later sync could pass by leaving the fresh
    load's values in place. A packed weight whose packing did not run then is the engine's own stale copy."""
    changed = {d["name"] for d in poisoned["diffs"]}
    repacked = poisoned["repacked"]
    out = []
    for key, (shape, _, _) in reference["state"].items():
        if not any(shape):
            continue
        name = engine_name(key)
        module = name.rsplit(".", 1)[0]
        if key.startswith("packed.") and repacked.get(module, 0) == 0:
            out.append(Finding(tensor=name, kind="poison-stale-packed",
                               message="when every checkpoint tensor was reloaded (sign-flipped) through the engine's "
                               "own reload_weights, the engine did not pack this weight again: it computes with the "
                               "copy it packed at its first load, whatever a sync sends"))  # fmt: skip
        elif key not in changed:
            out.append(Finding(tensor=name, kind="poison-not-reached",
                               message=f"the sign-flipped reload through the engine's own reload_weights left this "
                               f"{key.split('.')[0]} tensor as the fresh load had it: a sync that misses it cannot be "
                               "told from one that writes it"))  # fmt: skip
    if poisoned["outputs"] == reference["outputs"]:
        out.append(Finding(tensor="<outputs>", kind="poison-no-effect",
                           message="the engine's outputs did not change when every weight was poisoned"))  # fmt: skip
    return out
