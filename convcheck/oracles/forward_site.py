"""Where a Megatron forward raised: the innermost module that had started and not returned, with its parameters."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class ForwardSite:
    """The module a failed forward was inside: global parameter names and shapes, and what it was given."""

    module: str
    """Global Megatron module name, e.g. `decoder.layers.0.self_attention.q_layernorm`."""
    kind: str
    """Its class name."""
    params: dict[str, list[int]] = field(default_factory=dict)
    """Global name -> shape of each parameter the module holds itself."""
    inputs: list[list[int]] = field(default_factory=list)
    """Shapes of its positional tensor inputs."""

    @property
    def tensor(self) -> str:
        """The name a finding carries: the module's first own parameter, else the module."""
        return next(iter(self.params), self.module)

    def describe(self) -> str:
        held = ", ".join(f"{name.rpartition('.')[2]} {shape}" for name, shape in self.params.items()) or "no parameters"
        return f"inside {self.kind} {self.module} ({held}) called on input {', '.join(map(str, self.inputs)) or '-'}"


@contextlib.contextmanager
def tracking(chunks: list[Any], global_name: Callable[[str, int], str]) -> Iterator[Callable[[], ForwardSite | None]]:
    """Within: every module of `chunks` that starts its forward is pushed and popped when it returns; the yielded
    function gives, after a raise, the innermost one still open that holds parameters (None when none does)."""
    names: dict[int, tuple[int, str]] = {}
    for vp, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            while name.startswith("module."):
                name = name[len("module.") :]
            names.setdefault(id(module), (vp, name))
    open_calls: list[tuple[Any, list[list[int]]]] = []

    def enter(module: Any, args: Any) -> None:
        if id(module) in names:
            open_calls.append((module, [list(a.shape) for a in args if isinstance(a, torch.Tensor)]))

    def leave(module: Any, _args: Any, _out: Any) -> None:
        if open_calls and open_calls[-1][0] is module:
            open_calls.pop()

    def site() -> ForwardSite | None:
        for module, inputs in reversed(open_calls):
            own = list(module.named_parameters(recurse=False))
            if not own:
                continue
            vp, local = names[id(module)]
            params = {global_name(f"{local}.{p}", vp): list(t.shape) for p, t in own}
            first = next(iter(params))
            return ForwardSite(
                module=first.rpartition(".")[0], kind=type(module).__name__, params=params, inputs=inputs
            )
        return None

    pre = torch.nn.modules.module.register_module_forward_pre_hook(enter)
    post = torch.nn.modules.module.register_module_forward_hook(leave)
    try:
        yield site
    finally:
        pre.remove()
        post.remove()
