"""The bridge's quant_fn results kept for the reference (rank side): a 2-D block reference applied to the weight the
bridge quantized gives, block row by block row, what it gives any bf16 tensor whose block rows are bitwise those rows,
so the reference of such a tensor is assembled from the kept results instead of quantized a second time.

Why it is the reference, bitwise: a 2-D block quantizer (fp8-block, fp8-nemo-rl, fp8-ue8m0) computes each b0 x b1
block's bytes and scale from that block's elements alone (its amax, then each element), and the column blocks of two
tensors of the same width are the same column ranges. So for x [M, N] whose rows r .. r + b0 (r a multiple of b0) are
bitwise rows o .. o + b0 (o a multiple of b0) of a weight w [K, N] of the same dtype, the reference's q rows r .. r + b0
and scale row r / b0 of x are q rows o .. o + b0 and scale row o / b0 of w. Each match is a bitwise compare (integer
views); a tensor whose every block row does not match is quantized itself.

What is kept is a copy of each result (the bridge cannot change it afterwards) and the weight itself with its autograd
version counter: a weight written in place since quant_fn saw it (its version moved) is not used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from convcheck.compare.bits import int_view


def _row_key(x: torch.Tensor, row: int) -> tuple[Any, ...]:
    """What finds a block row again: the dtype, the width and the bytes of the block's first row."""
    return x.dtype, x.shape[1], int_view(x[row].contiguous()).numpy().tobytes()


@dataclass
class Kept:
    """One quant_fn call: the weight (the bridge's tensor itself), its version then, a copy of (q, scale)."""

    weight: torch.Tensor
    version: int
    q: torch.Tensor
    scale: torch.Tensor


@dataclass
class BlockReuse:
    """The results of every quant_fn call of this rank's quantized export, indexed by the first row of each block
    row."""

    block: tuple[int, int]
    kept: list[Kept] = field(default_factory=list)
    index: dict[tuple[Any, ...], list[tuple[int, int]]] = field(default_factory=dict)
    """Row key -> (kept entry, its row) for every block row of every kept weight."""
    hits: int = 0
    """Tensors whose reference was assembled from kept results."""
    keep_s: float = 0.0
    """Wall seconds `keep` took inside the quantized export (the oracle's work, not the export's)."""

    def keep(self, weight: torch.Tensor, block: tuple[int, int], q: torch.Tensor, scale: torch.Tensor) -> None:
        """Record one quant_fn call (`weight` [K, N] quantized at `block` into q and a [K / b0, ceil(N / b1)] scale);
        a call at another block, or whose rows the block does not divide, is not kept."""
        t0 = time.perf_counter()
        self._keep(weight, block, q, scale)
        self.keep_s += time.perf_counter() - t0

    def _keep(self, weight: torch.Tensor, block: tuple[int, int], q: torch.Tensor, scale: torch.Tensor) -> None:
        b0 = self.block[0]
        if tuple(block) != self.block or weight.dim() != 2 or weight.shape[0] % b0 or q.shape != weight.shape:
            return
        if scale.dim() != 2 or scale.shape[0] != weight.shape[0] // b0:
            return
        entry = len(self.kept)
        self.kept.append(Kept(weight=weight, version=weight._version, q=q.clone(), scale=scale.clone()))
        for row in range(0, weight.shape[0], b0):
            self.index.setdefault(_row_key(weight, row), []).append((entry, row))

    def reference(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(q, scale) of the reference applied to `x` [M, N], assembled from kept results where every block row of `x`
        is bitwise a block row of a kept weight that has not been written since; None otherwise."""
        b0 = self.block[0]
        if not self.kept or x.dim() != 2 or x.shape[0] % b0:
            return None
        found: list[tuple[int, int]] = []
        for row in range(0, x.shape[0], b0):
            match = self._match(x[row : row + b0], _row_key(x, row))
            if match is None:
                return None
            found.append(match)
        self.hits += 1
        return self._assemble(found)

    def _match(self, rows: torch.Tensor, key: tuple[Any, ...]) -> tuple[int, int] | None:
        """The first kept (entry, row) whose b0 rows are bitwise `rows`."""
        b0 = self.block[0]
        rows_bits = int_view(rows)
        for entry, row in self.index.get(key, ()):
            kept = self.kept[entry]
            if kept.weight._version != kept.version:
                continue
            if torch.equal(int_view(kept.weight[row : row + b0]), rows_bits):
                return entry, row
        return None

    def _assemble(self, found: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """q and scale from the found block rows: slices of one kept result where they run on in it, else joined."""
        b0 = self.block[0]
        runs: list[list[int]] = []  # [entry, first row, end row]
        for entry, row in found:
            if runs and runs[-1][0] == entry and runs[-1][2] == row:
                runs[-1][2] = row + b0
            else:
                runs.append([entry, row, row + b0])
        qs = [self.kept[e].q[a:b] for e, a, b in runs]
        scales = [self.kept[e].scale[a // b0 : b // b0] for e, a, b in runs]
        if len(runs) == 1:
            return qs[0], scales[0]
        return torch.cat(qs), torch.cat(scales)
