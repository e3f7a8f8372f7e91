"""fp32 forwards over low-precision models without an fp32 copy of the whole model.

Each top-level block (embedding, every layer, final norm, head) gets fp32 parameters for its own forward only
and its original tensors back afterwards, bit for bit; the logits equal those of the model upcast whole, while
memory holds the model once plus one block in fp32.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from convcheck.rank.memory import trim


def _upcast(tensors: Iterable[Any]) -> list[tuple[Any, Any]]:
    """Point each floating non-fp32 tensor at an fp32 copy; the (tensor, original data) pairs to restore."""
    saved = []
    for tensor in tensors:
        if tensor is not None and tensor.is_floating_point() and tensor.dtype != torch.float32:
            saved.append((tensor, tensor.data))
            tensor.data = tensor.data.float()
    return saved


def _restore(saved: list[tuple[Any, Any]]) -> None:
    for tensor, data in saved:
        tensor.data = data


def named_blocks(module: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(qualified name, module) of the modules that own parameters directly under the model's trunk: embedding,
    each layer, norm, head, in model order."""
    out = []
    for name, child in module.named_children():
        if isinstance(child, torch.nn.ModuleList):
            out += [(f"{prefix}{name}.{i}", layer) for i, layer in enumerate(child)]
        elif any(True for _ in child.parameters(recurse=False)):
            out.append((f"{prefix}{name}", child))
        elif any(True for _ in child.parameters()):
            out += named_blocks(child, f"{prefix}{name}.")
    return out


def blocks(module: Any) -> list[Any]:
    """The trunk's blocks of `named_blocks`, without their names."""
    return [block for _, block in named_blocks(module)]


@contextmanager
def fp32_forward(models: list[Any], shared: Iterable[Any] = (), whole: bool = False) -> Iterator[None]:
    """Run `models`' forwards in fp32: per block through hooks (or `whole`: everything upcast up front).

    Buffers, parameters outside every block and `shared` (a weight another block reads too, e.g. a tied
    embedding) stay fp32 for the whole context. Every original tensor is restored on exit."""
    shared = list(shared)
    trunk = [b for model in models for b in blocks(model)]
    in_blocks = {id(p) for b in trunk for p in b.parameters()} - {id(p) for p in shared}
    loose = [t for model in models for t in [*model.parameters(), *model.buffers()] if id(t) not in in_blocks]
    saved = _upcast(loose)
    handles = []

    def up(block: Any, _args: Any) -> None:
        block.__dict__["_convcheck_fp32"] = _upcast(p for p in block.parameters() if id(p) in in_blocks)

    def down(block: Any, _args: Any, _out: Any) -> None:
        _restore(block.__dict__.pop("_convcheck_fp32", []))
        trim()  # the block's fp32 copies go back to the system, not into a heap the next block only partly reuses

    try:
        if whole:
            saved += _upcast(p for model in models for p in model.parameters() if id(p) in in_blocks)
        else:
            for block in trunk:
                handles += [block.register_forward_pre_hook(up), block.register_forward_hook(down)]
        yield
    finally:
        for handle in handles:
            handle.remove()
        for block in trunk:
            _restore(block.__dict__.pop("_convcheck_fp32", []))
        _restore(saved)
