"""One pass over a chunk's modules gives exactly torch's named_parameters() then the bridge's persistent_buffers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from convcheck.rank.model import named_tensors, parameters_and_buffers


@pytest.fixture(autouse=True)
def _shims() -> None:
    """The bridge's utils import on a machine without Transformer Engine as the ranks import it."""
    from convcheck import compat

    compat.install_import_shims()


def _torch_way(chunk: Any) -> list[tuple[str, Any]]:
    from megatron.bridge.models.conversion.utils import persistent_buffers

    return list(chunk.named_parameters()) + list(persistent_buffers(chunk))


def _same(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> bool:
    return [n for n, _ in a] == [n for n, _ in b] and all(x is y for (_, x), (_, y) in zip(a, b))


def _tree() -> torch.nn.Module:
    """Shared submodules and parameters, a None parameter, a None child, non-persistent and repeated buffers."""
    shared = torch.nn.Linear(3, 3)
    root = torch.nn.Module()
    root.first = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    root.again = shared
    root.block = torch.nn.ModuleDict({"a": shared, "b": torch.nn.Linear(4, 2, bias=False)})
    root.block["b"].tied = root.first[0].weight  # one parameter under two names: the first one counts
    root.register_parameter("nothing", None)
    root.add_module("empty", None)
    root.register_buffer("kept", torch.ones(2))
    root.register_buffer("scratch", torch.zeros(2), persistent=False)
    root.block["b"].register_buffer("kept", root.kept)  # the same buffer in two modules: listed under both
    root.block["b"].register_buffer("twice", root.kept)  # and twice in one module: once there
    root.block["b"].register_buffer("gone", None)
    return root


def test_one_walk_is_named_parameters_then_persistent_buffers() -> None:
    root = _tree()
    fast = parameters_and_buffers(root)
    assert _same(fast, _torch_way(root))
    assert [n for n, _ in fast] == [
        "first.0.weight", "first.0.bias", "first.1.weight", "first.1.bias", "again.weight", "again.bias",
        "block.b.weight", "kept", "block.b.kept",
    ]  # fmt: skip


def test_a_module_that_walks_its_own_way_is_asked() -> None:
    """A class overriding a walking method is answered by its own methods (here: one parameter hidden)."""

    class Hiding(torch.nn.Linear):
        def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
            return ((n, p) for n, p in super().named_parameters(*args, **kwargs) if n != "bias")

    outer = Hiding(2, 2)
    assert [n for n, _ in parameters_and_buffers(outer)] == ["weight"]
    root = _tree()
    root.inner = Hiding(2, 2)  # below the top: torch's own walk reaches it through named_modules, as ours falls back
    assert _same(parameters_and_buffers(root), _torch_way(root))


def test_named_tensors_strip_wrappers_and_extra_state() -> None:
    wrapper = torch.nn.Module()
    wrapper.module = torch.nn.Linear(2, 2)
    wrapper.module.register_buffer("_extra_state", torch.zeros(1))
    assert [(vp, n) for vp, n, _ in named_tensors([wrapper, torch.nn.Linear(1, 1)])] == [
        (0, "weight"), (0, "bias"), (1, "weight"), (1, "bias"),
    ]  # fmt: skip
