"""What a Transformer Engine module registers, written as TE's own source says it, so that a test can read TE's
wheel and compare (tests/test_te_standin_wheel.py): plain data, no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TeSource:
    """Where TE defines a module: its file inside the wheel and the class whose `__init__` registers parameters."""

    path: str
    cls: str


@dataclass(frozen=True)
class ParamRule:
    """One parameter TE's `__init__` registers: its name (`weight{i}` for one per GEMM), its shape as the expressions
    TE passes to `torch.empty` / `torch.zeros` (written without `self.`), and the constructor argument its dtype
    comes from (None: torch's default dtype, fp32)."""

    name: str
    shape: tuple[str, ...]
    dtype: str | None


TE_VERSION = "2.20.2"
"""The Transformer Engine release the stand-in follows (its wheel is what the faithfulness test reads); megatron-core's
TE version checks are answered for it where the stand-in is bound (convcheck.compat.te_standin)."""
