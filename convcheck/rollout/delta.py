"""The engine oracle's planted update (rank side): a copy of the source checkpoint with a few tensors changed in a
known, deterministic way, for the delta sync that must leave the engine computing what a fresh load of it computes."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

CHANGED = 3
"""How many tensors the planted update changes."""


def _main_model(name: str, layers: int) -> bool:
    """Not an expert (vLLM's CPU MoE reload has its own named bug) and not an MTP layer (the engine loads none)."""
    parts = name.split(".")
    if ".experts." in name or name.startswith("mtp."):
        return False
    return not (parts[:2] == ["model", "layers"] and len(parts) > 2 and parts[2].isdigit() and int(parts[2]) >= layers)


def chosen(names: list[str], layers: int) -> list[str]:
    """The tensors the update changes: CHANGED of the main model's tensors, evenly spaced in name order."""
    pool = sorted(n for n in names if _main_model(n, layers))
    picks = sorted({pool[len(pool) * (k + 1) // (CHANGED + 1)] for k in range(CHANGED)}) if pool else []
    return picks


def updated(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` with the sign bit of every odd-indexed element (flat order) flipped: every such element's bits change,
    every even one's stay."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    flat = tensor.contiguous().view(ints).reshape(-1).clone()
    bit = torch.tensor(-(1 << (8 * tensor.element_size() - 1)), dtype=ints)
    flat[1::2] ^= bit
    return flat.view(tensor.dtype).reshape(tensor.shape)


def tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the safetensors files in `folder`, in name order per file."""
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in sorted(handle.keys()):
                yield name, handle.get_tensor(name)


def planted_update(source: Path, out: Path, layers: int) -> list[str]:
    """Write `out`: `source`'s files (config, tokenizer) and its tensors in one model.safetensors, the chosen ones
    updated. Returns the changed names."""
    out.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and not path.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy2(path, out / path.name)
    state = dict(tensors(source))
    names = [n for n in chosen(list(state), layers) if state[n].is_floating_point()]
    for name in names:
        state[name] = updated(state[name])
    save_file({n: t.contiguous() for n, t in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return names


def delta(folder: Path, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The changed tensors of the updated checkpoint at `folder`, in name order."""
    wanted = set(names)
    for name, tensor in tensors(folder):
        if name in wanted:
            yield name, tensor
