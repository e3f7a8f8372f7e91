"""Run-length probe results: (hf_start, local_start, length) blocks decoded on the device, compared slice by slice.

A mapping moves contiguous blocks, so a probe output decodes into few runs where the HF flat index and the shard's
local flat index both advance by one. Decoding is exact (every code checked through its run's endpoints); the
compare reads every element of every run.
"""

from __future__ import annotations

from typing import Any

import torch

from convcheck.compare.bits import bytes_equal, int_view, int_views_equal
from convcheck.compare.memory import equal_at, plain
from convcheck.probe.stubs import ProbeCommError

MAX_SLICED_RUNS = 4096
"""Above this many runs a task is compared by batched gathers instead of one slice pair per run."""
GATHER_BATCH = 1 << 24
"""Elements per gathered compare batch (bounds the index tensors built on the device)."""


def shard_codes(shape: tuple[int, ...], rank: int, numel: int, device: Any = None) -> tuple[Any, Any]:
    """Codes `rank * numel + i + 1` (i the local flat index) shaped like the shard, on `device`, and their dtype."""
    dtype = code_dtype(rank, numel)
    codes = torch.arange(rank * numel + 1, rank * numel + numel + 1, dtype=dtype, device=device).reshape(shape)
    return codes, dtype


def code_dtype(rank: int, numel: int) -> Any:
    """int32 when every code of this rank fits, else int64."""
    return torch.int32 if (rank + 1) * numel < 2**31 - 1 else torch.int64


def decode_runs(out: Any, rank: int, numel: int, code_dtype: Any) -> Any:
    """int64 [k, 3] CPU runs (hf_start, local_start, length) of this rank's codes in `out`; ProbeCommError when
    a code is foreign."""

    if out.dtype != code_dtype:
        raise ProbeCommError(f"probe: output dtype {out.dtype} is not the code dtype (the mapping computed, not moved)")
    fast = _row_runs(out.detach(), rank, numel)
    if fast is not None:
        return fast
    return _element_runs(out.detach(), rank, numel)


def view_runs(out: Any, codes: Any) -> Any | None:
    """The runs of an output that is a view of the (unwritten) codes whose last dim is contiguous, read from its
    storage offset and strides instead of its values (exact: each element is the code stored there); None when
    it is not such a view."""
    if not within(out, codes):
        return None
    offset = out.storage_offset() - codes.storage_offset()
    if out.is_contiguous():  # one block: element i is the code stored `offset + i` past the codes' first
        return torch.tensor([[0, offset, out.numel()]], dtype=torch.int64)
    shape, stride = list(out.shape), list(out.stride())
    starts = torch.zeros(1, dtype=torch.int64)
    for size, step in zip(shape[:-1], stride[:-1]):  # row starts, row-major over the leading dims
        starts = (starts.unsqueeze(1) + torch.arange(size, dtype=torch.int64) * step).reshape(-1)
    return _merged_rows(torch.arange(starts.numel(), dtype=torch.int64), starts + offset, shape[-1])


def within(out: Any, base: Any) -> bool:
    """True when `out` is a non-empty view of contiguous `base`'s memory, of its dtype, whose last dim is contiguous
    and whose every element lies inside `base` (so each element of `out` is one element of `base`)."""
    return views_inside(base)(out)


def views_inside(base: Any) -> Any:
    """`within(out, base)` as a function of `out` alone, with `base`'s own facts read once (a task's outputs are all
    asked about one weight)."""
    if not base.is_contiguous():
        return lambda out: False
    dtype, device, start, numel = base.dtype, base.device, base.data_ptr(), base.numel()

    def inside(out: Any) -> bool:
        if out.dtype != dtype or out.device != device or out.dim() == 0 or out.numel() == 0:
            return False
        stride = out.stride()
        if stride[-1] != 1 and out.shape[-1] != 1:
            return False
        offset, width = out.data_ptr() - start, out.element_size()
        if offset < 0 or offset % width:
            return False
        # by address: two live tensors' memory overlaps only where they share an allocation, so an `out` that starts
        # on an element of `base` and ends inside it is a view of it
        if out.is_contiguous():  # the common case: its last element is numel - 1 past its first
            return offset // width + out.numel() <= numel
        last = offset // width + sum((size - 1) * step for size, step in zip(out.shape, stride))  # never negative
        return last < numel

    return inside


def _merged_rows(index: Any, starts: Any, cols: int) -> Any:
    """Runs (CPU) of whole rows: HF row `index[i]` holds shard elements `starts[i]` .. + cols; a row that continues
    the previous one (both the HF row and the shard start advance by one row) extends its run."""
    if index.numel() > 1:
        joins = index[1:].sub(index[:-1]).eq(1) & starts[1:].sub(starts[:-1]).eq(cols)
        keep = torch.cat([torch.ones(1, dtype=torch.bool, device=joins.device), ~joins])
    else:
        keep = torch.ones(index.numel(), dtype=torch.bool, device=index.device)
    heads = keep.nonzero().squeeze(1)
    counts = torch.diff(torch.cat([heads, torch.tensor([index.numel()], device=heads.device)]))
    return torch.stack([index[heads] * cols, starts[heads], counts * cols], dim=1).cpu()


def _row_runs(out: Any, rank: int, numel: int) -> Any | None:
    """The runs when every row (last dim) of `out` is all zero or one contiguous in-range block of this rank's
    codes (the common case: whole rows moved), proven by one comparison with the rows the first codes imply; None
    when not (then the element decoder decides). Runs of consecutive rows are merged, as the element decoder does."""
    cols = out.shape[-1] if out.dim() else 1
    if out.numel() == 0 or cols == 0:
        return None
    rows = out.reshape(-1, cols)
    first = rows[:, 0]
    mine = first.ne(0)
    local = first.to(torch.int64) - 1 - rank * numel
    if bool((mine & (local.lt(0) | local.gt(numel - cols))).any()):
        return None  # out of range: leave the verdict to the element decoder
    index = mine.nonzero().squeeze(1)
    if not _rows_hold(rows, first, mine, index):
        return None
    return _merged_rows(index, local[index], cols)


def _rows_hold(rows: Any, first: Any, mine: Any, index: Any) -> bool:
    """True when the rows marked `mine` each equal their first code plus 0, 1, 2, ... and every other row is zero
    (one block of rows is checked through views, without copies)."""
    if index.numel() == 0:
        return not bool(rows.any())
    a, b = int(index[0]), int(index[-1]) + 1
    if b - a == index.numel():  # the rows of this rank form one block
        block = rows[a:b]
        if bool(rows[:a].any()) or bool(rows[b:].any()):
            return False
        return _ramps_hold(block, first[a:b])
    return not bool(rows[~mine].any()) and _ramps_hold(rows[mine], first[mine])


RAMP_BATCH = 1 << 24
"""Elements of the expected-codes ramp built at once (bounds the probe's memory on a large tensor)."""


def _ramps_hold(block: Any, first: Any) -> bool:
    """True when each row of `block` [r, c] equals its first code plus 0 .. c-1, compared a batch of rows at a time."""
    cols = block.shape[1]
    ramp = torch.arange(cols, dtype=block.dtype, device=block.device)
    step = max(1, RAMP_BATCH // max(cols, 1))
    return all(
        bytes_equal(first[i : i + step].unsqueeze(1) + ramp, block[i : i + step])
        for i in range(0, block.shape[0], step)
    )


def _element_runs(out: Any, rank: int, numel: int) -> Any:
    """The runs decoded element by element (any rearrangement); ProbeCommError when a code is foreign."""
    flat = out.reshape(-1)
    mine = flat.ne(0)
    follows = torch.zeros_like(mine)
    if flat.numel() > 1:
        follows[1:] = mine[1:] & mine[:-1] & flat[1:].sub(flat[:-1]).eq(1)
    starts = (mine & ~follows).nonzero().squeeze(1)
    last = torch.ones_like(mine)
    if flat.numel() > 1:
        last[:-1] = ~follows[1:]
    ends = (mine & last).nonzero().squeeze(1)
    first_code = flat[starts].to(torch.int64)
    last_code = flat[ends].to(torch.int64)
    runs = torch.stack([starts, first_code - 1 - rank * numel, ends - starts + 1], dim=1).cpu()
    last_local = last_code.cpu() - 1 - rank * numel
    # exact: codes in a run rise by one (checked per element above), so endpoints in range bound every code, and
    # last - first == length - 1 in int64 rules out a wrap-around inside the code dtype
    if runs.numel() and (
        bool(runs[:, 1].lt(0).any())
        or bool(last_local.ge(numel).any())
        or bool(last_local.sub(runs[:, 1]).ne(runs[:, 2] - 1).any())
    ):
        raise ProbeCommError("probe: output holds codes of another rank or out of range (placeholders leaked)")
    return runs


def owned(runs: Any) -> int:
    """How many elements the runs cover."""
    return int(runs[:, 2].sum()) if runs.numel() else 0


def hf_ranges(runs: Any) -> list[tuple[int, int]]:
    """The runs' HF positions as ascending half-open (start, stop) ranges, adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for start, _local, length in runs.tolist():
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], start + length)
        else:
            out.append((start, start + length))
    return out


def _expand(runs: Any, device: Any) -> tuple[Any, Any]:
    """Per-element (hf, local) flat indices of a batch of runs, built on `device`."""
    runs = runs.to(device)
    lengths = runs[:, 2]
    total = int(lengths.sum())
    begin = torch.cumsum(lengths, 0) - lengths
    offset = torch.arange(total, device=device) - torch.repeat_interleave(begin, lengths, output_size=total)
    hf = torch.repeat_interleave(runs[:, 0], lengths, output_size=total) + offset
    local = torch.repeat_interleave(runs[:, 1], lengths, output_size=total) + offset
    return hf, local


def _batches(runs: Any) -> list[Any]:
    """Consecutive groups of runs of at most GATHER_BATCH elements each (a longer run is a group alone)."""
    groups, begin, total = [], 0, 0
    for i, length in enumerate(runs[:, 2].tolist()):
        if total and total + length > GATHER_BATCH:
            groups.append(runs[begin:i])
            begin, total = i, 0
        total += length
    if begin < len(runs):
        groups.append(runs[begin:])
    return groups


def _sliced(real_bits: Any, mine_bits: Any, runs: Any) -> list[int]:
    """Indices of the runs whose slices differ, one slice pair compared per run (both flat integer views of one
    width on one device, as `mismatched_runs` takes them)."""
    return [
        i
        for i, (h, loc, n) in enumerate(runs.tolist())
        if not int_views_equal(real_bits[h : h + n], mine_bits[loc : loc + n])
    ]


def mismatched_runs_in_place(real: Any, mine: Any, runs: Any) -> list[int] | None:
    """`mismatched_runs` of two tensors read where they lie (compare.memory's memcmp, no views built): when both are
    plain CPU tensors of one element width and the runs are few; None otherwise (the caller takes integer views)."""
    if len(runs) > MAX_SLICED_RUNS or real.element_size() != mine.element_size() or not (plain(real) and plain(mine)):
        return None
    try:
        return [i for i, (h, loc, n) in enumerate(runs.tolist()) if not equal_at(real, h, mine, loc, n)]
    except ValueError:  # a run outside a tensor: the sliced compare reports it as a mismatch
        return None


def differing_runs(real: Any, mine: Any, runs: Any) -> list[int]:
    """Indices of the runs whose elements of `real` differ bitwise from `mine`'s (one element width, one device): read
    in place where both are plain CPU tensors, else compared as integer views."""
    found = mismatched_runs_in_place(real, mine, runs)
    return found if found is not None else mismatched_runs(int_view(real), int_view(mine), runs)


def mismatched_runs(real_bits: Any, mine_bits: Any, runs: Any) -> list[int]:
    """Indices of the runs whose real elements differ bitwise from the shard's (flat integer views of one width, one
    device: `int_view` of both)."""
    floating = real_bits.dtype.is_floating_point or real_bits.dtype.is_complex
    if floating or real_bits.dtype != mine_bits.dtype or real_bits.device != mine_bits.device:
        raise ValueError(
            f"mismatched_runs takes integer views of one width on one device: {real_bits.dtype}/{real_bits.device} "
            f"vs {mine_bits.dtype}/{mine_bits.device}"
        )
    if len(runs) <= MAX_SLICED_RUNS:
        return _sliced(real_bits, mine_bits, runs)
    bad: list[int] = []
    first = 0
    for group in _batches(runs):
        hf, local = _expand(group, real_bits.device)
        if not bytes_equal(mine_bits[local], real_bits[hf]):
            bad += [first + i for i in _sliced(real_bits, mine_bits, group)]
        first += len(group)
    return bad


def diff_positions(real_bits: Any, mine_bits: Any, runs: Any) -> tuple[Any, Any]:
    """(hf, local) int64 CPU flat indices of every differing element of the given runs, ascending by hf."""
    hfs, locals_ = [], []
    for h, loc, n in runs.tolist():
        diff = real_bits[h : h + n].ne(mine_bits[loc : loc + n]).nonzero().squeeze(1).cpu()
        hfs.append(diff + h)
        locals_.append(diff + loc)
    empty = torch.zeros(0, dtype=torch.int64)
    return (torch.cat(hfs) if hfs else empty), (torch.cat(locals_) if locals_ else empty)
