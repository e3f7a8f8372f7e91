"""Benchmark: `verify` at real size as ratios to the bare bridge roundtrip measured in the same run; prints JSON.

    python bench/bench_realsize.py --layers 1 --ep 2                      # real-dims Qwen3-30B-A3B cut, CPU
    python bench/bench_realsize.py --layers 4 --device cuda               # the same, 4 layers, one GPU
    python bench/bench_realsize.py --layers 48 --tiny-dims --ep 2         # 48 x 128 experts (~18.9k HF tensors)
    python bench/bench_realsize.py --layers 1 --ep 2 --runs "save"        # the save oracle (bridge writer) alone

The checkpoint is built from Qwen3-30B-A3B's config (written in code; --layers cuts it, --tiny-dims shrinks every
width and keeps the tensor count) with random bf16 weights, saved as safetensors, cached by its parameters. The
bare roundtrip is one launch of the same ranks that loads the HF checkpoint into the sharded model, exports it and
compares every tensor's bytes to the source (the floor any verifier pays); each `verify` run is timed the same way
(wall clock around the whole call, launches included). Per-oracle seconds come from the report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN3_30B_A3B = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
"""Qwen3-30B-A3B's config.json fields that shape its tensors (Qwen/Qwen3-30B-A3B on the Hugging Face hub)."""
TINY_DIMS = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
"""Widths of the tensor-count variant: every tensor of the real model, tiny."""


def build(folder: Path, layers: int, tiny_dims: bool, experts: int, seed: int = 0, device: str = "cpu") -> Path:
    """Write the cut checkpoint (config.json + bf16 safetensors shards of <= 2 GB + a word-level tokenizer, as the
    save oracle's writer needs one) unless it is already there; random values drawn on `device`."""
    from convcheck.fixtures.build import write_tokenizer

    if (folder / ".complete").exists():
        if not (folder / "tokenizer.json").exists():  # made before the tokenizer was part of it
            write_tokenizer(folder, QWEN3_30B_A3B["vocab_size"] if not tiny_dims else TINY_DIMS["vocab_size"])
        return folder
    import torch
    import transformers
    from safetensors.torch import save_file

    fields = {**QWEN3_30B_A3B, "num_hidden_layers": layers, "num_experts": experts, **(TINY_DIMS if tiny_dims else {})}
    fields["num_experts_per_tok"] = min(fields["num_experts_per_tok"], experts)
    config = transformers.Qwen3MoeConfig(**fields, architectures=["Qwen3MoeForCausalLM"], dtype="bfloat16")
    shapes = checkpoint_shapes(fields)
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    shard: dict[str, Any] = {}
    weight_map: dict[str, str] = {}
    files: list[tuple[str, dict[str, Any]]] = []

    def flush() -> None:
        if shard:
            files.append((f"model-{len(files) + 1:05d}.safetensors", dict(shard)))
            save_file(shard, str(folder / files[-1][0]), metadata={"format": "pt"})
            weight_map.update({n: files[-1][0] for n in shard})
            shard.clear()

    size = 0
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensor = 1.0 + 0.01 * torch.randn(shape, generator=gen, device=device)
        else:
            tensor = 0.02 * torch.randn(shape, generator=gen, device=device)
        shard[name] = tensor.to(torch.bfloat16).cpu()
        size += shard[name].numel() * 2
        if size >= 2 << 30:
            flush()
            size = 0
    flush()
    config.save_pretrained(folder)
    write_tokenizer(folder, int(fields["vocab_size"]))
    index = {"metadata": {"total_size": sum(2 * _numel(s) for s in shapes.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    (folder / ".complete").write_text("ok\n")
    return folder


def build_names_only(folder: Path, layers: int, experts: int = 128) -> Path:
    """The real-dims cut as config.json, index, tokenizer and bf16 safetensors shards of <= 2 GB whose headers are
    true and whose data regions are holes (sparse files: no bytes on disk, zeros if read): for a bench whose model
    is not loaded from it (a live check reads names, shapes and dtypes only), at any layer count a disk can hold."""
    import transformers

    from convcheck.fixtures.build import write_tokenizer

    if (folder / ".complete").exists():
        return folder
    fields = {**QWEN3_30B_A3B, "num_hidden_layers": layers, "num_experts": experts}
    fields["num_experts_per_tok"] = min(fields["num_experts_per_tok"], experts)
    config = transformers.Qwen3MoeConfig(**fields, architectures=["Qwen3MoeForCausalLM"], dtype="bfloat16")
    folder.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, tuple[int, ...]]] = [{}]
    size = 0
    for name, shape in checkpoint_shapes(fields).items():
        if size >= 2 << 30:
            shards.append({})
            size = 0
        shards[-1][name] = shape
        size += 2 * _numel(shape)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in shard.items():
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + 2 * _numel(shape)]}
            offset += 2 * _numel(shape)
            weight_map[name] = file
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(folder / file, "wb") as out:
            out.write(len(text).to_bytes(8, "little") + text)
            out.truncate(8 + len(text) + offset)  # the data region: a hole
    config.save_pretrained(folder)
    write_tokenizer(folder, int(fields["vocab_size"]))
    total = sum(2 * _numel(s) for s in checkpoint_shapes(fields).values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    (folder / ".complete").write_text("ok\n")
    return folder


def checkpoint_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a Qwen3-MoE checkpoint as published (one tensor per expert projection)."""
    h, v, hd, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"], cfg["moe_intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"model.embed_tokens.weight": (v, h)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate.weight": (cfg["num_experts"], h),
        })  # fmt: skip
        for e in range(cfg["num_experts"]):
            x = f"{p}mlp.experts.{e}."
            out.update(
                {
                    x + "gate_proj.weight": (inter, h),
                    x + "up_proj.weight": (inter, h),
                    x + "down_proj.weight": (h, inter),
                }
            )
    out.update({"model.norm.weight": (h,), "lm_head.weight": (v, h)})
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def bare_roundtrip(ctx: Any) -> dict[str, Any]:
    """Rank function: the bridge's export of the loaded model, every tensor's bytes compared with the source."""
    from convcheck.compare.bits import bytes_equal
    from convcheck.hf.tensors import TensorReader
    from convcheck.rank.memory import AnonPeak

    anon = AnonPeak()
    reader = TensorReader(ctx.checkpoint) if ctx.is_reporter else None
    on_device = ctx.device == "cuda"
    t0 = time.perf_counter()
    same = exported = 0
    compare_s = 0.0
    for name, tensor in ctx.bridge_export(cpu=not on_device):
        exported += 1
        if reader is not None and name in ctx.checkpoint.tensors:
            c0 = time.perf_counter()
            same += bytes_equal(reader.get(name).to(tensor.device), tensor)
            compare_s += time.perf_counter() - c0
    from convcheck.rank.memory import memory_mb

    seconds = round(time.perf_counter() - t0, 3)
    peak = memory_mb().get("VmHWM", -1.0)
    export_anon = anon.take()
    anon.stop()
    return {
        "export_compare_s": seconds,
        "export_s": round(seconds - compare_s, 3),
        "exported": exported,
        "identical": same,
        "rank0_peak_MB": peak,
        "rank0_export_anon_peak_MB": export_anon,
    }


def memory_goal(folder: Path, tp: int, ep: int) -> dict[str, float]:
    """Rank 0's share of the checkpoint (dense / tp, experts / (ep * tp)), its largest tensor, and the goal
    share + 2 x largest + 1 GB, in MB."""
    from convcheck.hf.checkpoint import open_weights

    dense = experts = largest = 0
    for name, entry in open_weights(folder).tensors.items():
        largest = max(largest, entry.nbytes)
        if ".mlp.experts." in name:
            experts += entry.nbytes
        else:
            dense += entry.nbytes
    share = dense / tp + experts / (ep * tp)
    mb = 1 << 20
    return {
        "rank0_share_MB": round(share / mb, 1),
        "largest_tensor_MB": round(largest / mb, 1),
        "goal_MB": round((share + 2 * largest + (1 << 30)) / mb, 1),
    }


def _note(partial: dict[str, Any]) -> None:
    """One stage's numbers on stderr as soon as they exist (a run cut short still says what it measured)."""
    sys.stderr.write(json.dumps(partial) + "\n")
    sys.stderr.flush()


def _metrics(verdict: Any) -> dict[str, Any]:
    """The oracle's own metrics (e.g. the mapping oracle's gathers), when it reports any."""
    metrics = getattr(verdict, "metrics", None)
    return {"metrics": dict(metrics)} if metrics else {}


EXPORT_GOAL_ORACLES = ("differential", "elements", "mapping")
"""The oracles whose goal is <= 1x the bridge export's own time."""


def vs_export(oracles: dict[str, Any], export_s: float) -> dict[str, float]:
    """Each goal oracle's cost over the bare export's own time (rank 0, compare excluded): its phase's seconds plus
    the seconds its work took inside an earlier oracle's export drain (metrics `in_export_s`)."""
    out = {}
    for name in EXPORT_GOAL_ORACLES:
        entry = oracles.get(name)
        if entry is None or export_s <= 0:
            continue
        cost = entry["seconds"] + float(entry.get("metrics", {}).get("in_export_s", 0.0))
        out[name] = round(cost / export_s, 3)
    return out


def _timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn()
    return value, round(time.perf_counter() - t0, 3)


def main() -> None:
    """Build (or reuse) the checkpoint, run the bare roundtrip and each verify, print one JSON object."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--tiny-dims", action="store_true")
    p.add_argument("--model", help="an existing HF checkpoint folder instead of building one")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--runs", default="coverage,roundtrip;default", help="';'-separated oracle lists ('default')")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--work", default=os.environ.get("CONVCHECK_CACHE_DIR", "/tmp") + "/realsize")
    args = p.parse_args()
    from convcheck.api import run_in_ranks, verify

    tag = f"qwen3-30b-a3b-{'tiny-' if args.tiny_dims else ''}{args.layers}l-{args.experts}e"
    built, build_s = _timed(
        lambda: (
            args.model
            or str(build(Path(args.work) / tag, args.layers, args.tiny_dims, args.experts, device=args.device))
        )
    )
    model = str(built)
    _note({"build_s": build_s})
    layout = f"tp{args.tp}ep{args.ep}"
    common = {"device": args.device, "timeout_s": args.timeout}
    bare, bare_s = _timed(lambda: run_in_ranks(f"{Path(__file__).resolve()}:bare_roundtrip", model, layout, **common))
    _note({"bare_roundtrip_s": bare_s, "bare": bare})
    out: dict[str, Any] = {
        "bench": "realsize",
        "model": args.model or tag,
        "layout": layout,
        "device": args.device,
        "bare_roundtrip_s": bare_s,
        "bare": bare,
        "memory_goal": memory_goal(Path(model), args.tp, args.ep),
    }
    for spec in args.runs.split(";"):
        oracles = None if spec == "default" else spec
        report, seconds = _timed(lambda oracles=oracles: verify(model, layout, oracles=oracles, **common))
        out[f"verify[{spec}]"] = {
            "seconds": seconds,
            "ratio": round(seconds / bare_s, 3),
            "verdict": report.verdict,
            "rank0_peak_MB": max(report.rank0_peak_MB.values(), default=-1.0),
            "rank0_peak_MB_by_phase": report.rank0_peak_MB,
            "rank0_anon_peak_MB": max(report.rank0_anon_peak_MB.values(), default=-1.0),
            "rank0_anon_peak_MB_by_phase": report.rank0_anon_peak_MB,
            "oracles": {
                o.name: {"seconds": o.seconds, "verdict": o.verdict, "checked": o.checked, **_metrics(o)}
                for o in report.oracles
            },
        }
        entry = out[f"verify[{spec}]"]
        entry["vs_export"] = vs_export(entry["oracles"], bare.get("export_s", 0.0))
        _note({spec: out[f"verify[{spec}]"]})
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
