"""Elements oracle: exactly-once coverage from index-coded probes; gaps and overlaps as HF index ranges."""

from __future__ import annotations

import pytest
import torch

from convcheck.compare.bits import bytes_equal, int_view
from convcheck.oracles.elements import assemble
from convcheck.probe import runs as runs_mod
from convcheck.probe.run import to_ranges, where_hits, write_counts
from convcheck.probe.runs import decode_runs, diff_positions, hf_ranges, mismatched_runs, owned, shard_codes
from convcheck.probe.stubs import ProbeCommError


def _expand(runs: torch.Tensor) -> tuple[list[int], list[int]]:
    hf = [h + i for h, _, n in runs.tolist() for i in range(n)]
    local = [loc + i for _, loc, n in runs.tolist() for i in range(n)]
    return hf, local


def test_codes_roundtrip_through_a_rearrangement() -> None:
    codes, dtype = shard_codes((4, 3), rank=1, numel=12)
    placeholder = torch.zeros_like(codes)
    out = torch.cat([placeholder, codes.t().contiguous().reshape(4, 3)])  # any pure rearrangement
    runs = decode_runs(out, 1, 12, dtype)
    hf, local = _expand(runs)
    assert hf == list(range(12, 24))
    assert local == codes.t().contiguous().reshape(-1).sub(13).tolist()
    assert owned(runs) == 12 and hf_ranges(runs) == [(12, 24)]


def test_contiguous_blocks_decode_to_few_runs() -> None:
    codes, dtype = shard_codes((4, 6), rank=0, numel=24)
    out = torch.cat([codes[2:], torch.zeros(2, 6, dtype=dtype), codes[:2]])  # two row blocks swapped, a gap
    assert decode_runs(out, 0, 24, dtype).tolist() == [[0, 12, 12], [24, 0, 12]]
    assert hf_ranges(decode_runs(out, 0, 24, dtype)) == [(0, 12), (24, 36)]


@pytest.mark.parametrize(
    "out",
    [
        torch.tensor([1, 2, 30], dtype=torch.int32),  # a code past this rank's shard
        torch.tensor([0, -5, -4], dtype=torch.int32),  # negative codes
        torch.tensor([2**31 - 1, -(2**31), 1], dtype=torch.int32),  # a run that wraps around the code dtype
    ],
)
def test_foreign_codes_are_refused(out: torch.Tensor) -> None:
    with pytest.raises(ProbeCommError):
        decode_runs(out, 0, 3, torch.int32)


def test_run_compare_names_every_wrong_element(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = torch.randn(64, dtype=torch.bfloat16)
    runs = torch.tensor([[0, 32, 16], [16, 0, 32], [48, 48, 16]])
    real = torch.cat([weight[32:48], weight[0:32], weight[48:64]])
    real_bits, mine_bits = int_view(real), int_view(weight)
    assert mismatched_runs(real_bits, mine_bits, runs) == []
    real[20] = -real[20] if real[20] != 0 else 1.0  # one wrong element in the second run (local index 4)
    real[63] = float("nan")
    for limit in (4096, 1):  # sliced, then batched gathers (two runs per batch)
        monkeypatch.setattr(runs_mod, "MAX_SLICED_RUNS", limit)
        monkeypatch.setattr(runs_mod, "GATHER_BATCH", 40)
        bad = mismatched_runs(int_view(real), mine_bits, runs)
        assert bad == [1, 2]
        hf, local = diff_positions(int_view(real), mine_bits, runs[bad])
        assert hf.tolist() == [20, 63] and local.tolist() == [4, 63]
    with pytest.raises(ValueError, match="integer views of one width"):
        mismatched_runs(real, weight, runs)  # float tensors: torch.equal would not be bitwise (NaN, -0.0)


def test_ranges_and_counts() -> None:
    assert to_ranges(torch.tensor([0, 1, 2, 5, 6, 9])) == [(0, 3), (5, 7), (9, 10)]
    pieces = write_counts(6, [[(0, 3)], [(2, 5)]])
    assert pieces == [(0, 2, 1), (2, 3, 2), (3, 5, 1), (5, 6, 0)]
    assert where_hits(pieces, lambda n: n == 0) == [(5, 6)]
    assert where_hits(pieces, lambda n: n == 1) == [(0, 2), (3, 5)]
    assert where_hits(write_counts(6, [[(0, 2), (2, 4)], [(4, 6)]]), lambda n: n == 1) == [(0, 6)]


def _rec(task: int, writer: list, ranges: list, shape: list) -> dict:
    return {
        "task": task,
        "param": f"p{task}",
        "hf": "w",
        "shape": shape,
        "writer": writer,
        "ranges": ranges,
        "owned": sum(b - a for a, b in ranges),
    }


def test_gap_and_overlap_named_by_hf_index() -> None:
    ok, proven = assemble(
        [[_rec(0, [["tp", 0]], [(0, 8)], [4, 4])], [_rec(0, [["tp", 1]], [(8, 16)], [4, 4])]], {"w": (4, 4)}
    )
    assert not ok and proven == 16
    findings, _ = assemble(
        [[_rec(0, [["tp", 0]], [(0, 10)], [4, 4])], [_rec(0, [["tp", 1]], [(8, 14)], [4, 4])]], {"w": (4, 4)}
    )
    kinds = {f.kind: f for f in findings}
    assert kinds["overlap"].detail["first_index"] == [2, 0] and "[2, 0]..[2, 1]" in kinds["overlap"].message
    assert kinds["gap"].detail["first_index"] == [3, 2]


def test_replicas_count_once() -> None:
    findings, proven = assemble([[_rec(0, [], [(0, 16)], [4, 4])], [_rec(0, [], [(0, 16)], [4, 4])]], {"w": (4, 4)})
    assert not findings and proven == 16


def _patterns(shape: tuple[int, ...], rank: int) -> tuple[list[torch.Tensor], int, torch.dtype]:
    """Probe outputs a mapping can make of one shard: whole rows moved, rows placed among zeros, rows reordered,
    column blocks, transposes, permutations, duplicates, and two with a foreign code."""
    numel = 1
    for d in shape:
        numel *= d
    codes, dtype = shard_codes(shape, rank, numel)
    zeros = torch.zeros_like(codes)
    rows = codes.reshape(-1, codes.shape[-1])
    out = [
        codes,
        torch.cat([codes, zeros]),
        torch.cat([zeros, codes]),
        torch.cat([codes, codes]),
        codes.flip(0).contiguous(),
        codes.reshape(-1).flip(0).reshape(shape).contiguous(),
        codes.reshape(-1)[torch.randperm(numel, generator=torch.Generator().manual_seed(rank))].reshape(shape),
        torch.cat([rows[rows.shape[0] // 2 :], torch.zeros_like(rows[:1]), rows[: rows.shape[0] // 2]]),
    ]
    if codes.dim() >= 2:
        out += [torch.cat([codes, zeros], -1), codes.transpose(-1, -2).contiguous()]
    for at, value in ((-1, 100), (0, -3)):
        bad = codes.clone().reshape(-1)
        bad[at] = bad[at] + value
        out.append(bad.reshape(shape))
    return out, numel, dtype


@pytest.mark.parametrize("shape", [(4, 6), (8, 3), (12,), (2, 3, 4), (1, 5), (6, 1)])
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_row_decoder_agrees_with_the_element_decoder(shape: tuple[int, ...], rank: int) -> None:
    """The whole-row fast path gives exactly the element decoder's runs, or its refusal, on every pattern."""
    from convcheck.probe.runs import _element_runs, _row_runs

    outs, numel, dtype = _patterns(shape, rank)
    fast = 0
    for out in outs:
        try:
            want = _element_runs(out, rank, numel).tolist()
        except ProbeCommError:
            want = None
        try:
            got = decode_runs(out, rank, numel, dtype).tolist()
        except ProbeCommError:
            got = None
        assert got == want, out
        fast += _row_runs(out, rank, numel) is not None
    assert fast >= 2  # whole-row patterns took the fast path


def test_code_cache_reuses_pristine_codes_only() -> None:
    """Tasks of one shape share their codes; a write into them, or a shard over the size cap, is not reused; a view
    per task keeps one task's attributes off the next."""
    from convcheck.probe.run import CodeCache

    cache = CodeCache(size=2, max_bytes=1 << 10)
    first, dtype, key = cache.get((4, 3), 1, 12, "cpu")
    first.partition_dim = 0
    cache.release(key)
    again, _, key = cache.get((4, 3), 1, 12, "cpu")
    assert again.data_ptr() == first.data_ptr() and not hasattr(again, "partition_dim")
    assert bytes_equal(again, shard_codes((4, 3), 1, 12)[0]) and dtype == torch.int32
    again[0, 0] = 0  # a mapping that writes into its input
    cache.release(key)
    fresh, _, key = cache.get((4, 3), 1, 12, "cpu")
    assert fresh.data_ptr() != first.data_ptr() and bytes_equal(fresh, shard_codes((4, 3), 1, 12)[0])
    cache.release(key)
    big, _, key = cache.get((64, 8), 0, 512, "cpu")  # 2 KiB > the 1 KiB cap
    cache.release(key)
    assert cache.get((64, 8), 0, 512, "cpu")[0].data_ptr() != big.data_ptr()


def _views(codes: torch.Tensor) -> list[torch.Tensor]:
    """Views a mapping can return of its input: itself, reshapes, row slices (vocab unpadding), chunks (gate/up),
    column slices, a broadcast, a transpose, a stepped slice."""
    rows = codes.reshape(-1, codes.shape[-1])
    half = max(1, rows.shape[0] // 2)
    out = [codes, codes.reshape(-1), rows[:half], rows[half:], *torch.chunk(rows, 2, dim=0), rows[1:, :]]
    if rows.shape[-1] > 1:
        out += [rows[:, 1:], rows[:, : rows.shape[-1] // 2 or 1], rows.t(), rows[::2], rows[:, ::2]]
    out.append(rows[:1].expand(3, -1))
    return [v for v in out if v.numel()]


@pytest.mark.parametrize("shape", [(4, 6), (8, 3), (12,), (2, 3, 4), (1, 5), (6, 1)])
@pytest.mark.parametrize("rank", [0, 2])
def test_view_runs_are_the_decoders_runs(shape: tuple[int, ...], rank: int) -> None:
    """For an output that is a view of the codes, the runs read from its strides are exactly the decoded runs; a
    copy or another storage is left to the decoder (None)."""
    from convcheck.probe.runs import view_runs

    numel = 1
    for d in shape:
        numel *= d
    codes, dtype = shard_codes(shape, rank, numel)
    taken = 0
    for view in _views(codes):
        got = view_runs(view, codes)
        want = decode_runs(view, rank, numel, dtype).tolist()
        if got is not None:
            taken += 1
            assert got.tolist() == want, (view.shape, view.stride(), view.storage_offset())
    assert taken >= 5
    assert view_runs(codes.clone(), codes) is None
    assert view_runs(codes.view(torch.float32) if dtype == torch.int32 else codes.float(), codes) is None


def test_probe_reads_values_once_the_mapping_wrote_into_its_input() -> None:
    """A mapping that writes into its input and returns it: the version counter moved, so the probe decodes the
    values (the written element is not this rank's code) instead of trusting the view."""
    from types import SimpleNamespace

    from convcheck import compat
    from convcheck.probe.run import probe_task

    compat.install_import_shims()  # the probe imports the bridge's mapping classes

    class Writes:
        def megatron_to_hf(self, weights: torch.Tensor, module: object) -> dict[str, torch.Tensor]:
            weights.reshape(-1)[3] = weights.reshape(-1)[0]  # element 3 now holds element 0's code
            return {"w": weights}

    task = SimpleNamespace(mapping=Writes(), megatron_module=None, param_weight=torch.zeros(4, 6, dtype=torch.bfloat16))
    runs = probe_task(task, 0)["w"].runs.tolist()
    assert runs == [[0, 0, 3], [3, 0, 1], [4, 4, 20]]


def test_a_write_into_a_placeholder_is_refused() -> None:
    """Placeholders are shared zeros: an in-place write into one (through a view too) raises; reads do not."""
    from convcheck.probe.stubs import ProbeState

    state = ProbeState()
    like = torch.ones(4, 3, dtype=torch.int32)
    zeros = state.placeholder(like)
    assert state.placeholder(like) is zeros and not bool(zeros.clone().add_(1).eq(0).any())
    state.check_pool()
    zeros.reshape(-1)[5:6].fill_(7)
    with pytest.raises(ProbeCommError, match="placeholder"):
        state.check_pool()


def test_placeholders_are_zeroed_once_and_a_written_one_is_not_served_again() -> None:
    """A CodeCache keeps small placeholders for later tasks; one a mapping wrote into is dropped after the refusal,
    and one written with zeros stays (still all zeros)."""
    from convcheck.probe.run import CodeCache

    cache = CodeCache()
    like = torch.ones(4, 3, dtype=torch.int32)
    first = cache.state().placeholder(like)
    state = cache.state()
    assert state.placeholder(like) is first and state.is_placeholder(first[1:]) and not state.is_placeholder(like)
    first.zero_()
    state.check_pool()
    assert cache.state().placeholder(like) is first
    first[0, 0] = 5
    with pytest.raises(ProbeCommError, match="placeholder"):
        cache.state().check_pool()
    fresh = cache.state().placeholder(like)
    assert fresh is not first and not bool(fresh.any())


def test_an_output_that_is_a_placeholder_view_has_no_runs_and_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a gather stub fills for other ranks comes back with no runs without its values being decoded; a real
    code beside it still decodes."""
    from types import SimpleNamespace

    from convcheck.probe import run as run_mod

    class Gathers:
        def megatron_to_hf(self, weights: torch.Tensor, module: object) -> dict[str, torch.Tensor]:
            other = self._convcheck_probe.placeholder(weights)
            return {"mine": weights, "theirs": other.view(-1)[2:], "both": torch.cat([weights, other])}

    mapping = Gathers()
    monkeypatch.setattr(run_mod, "warm", lambda mapping, module: None)
    monkeypatch.setattr(run_mod, "probe_copy", lambda m, state: (setattr(m, "_convcheck_probe", state), m)[1])
    decoded = []
    real_decode = run_mod.decode_runs
    monkeypatch.setattr(run_mod, "decode_runs", lambda t, *a: (decoded.append(t.shape), real_decode(t, *a))[1])
    task = SimpleNamespace(mapping=mapping, megatron_module=None, param_weight=torch.zeros(4, 6, dtype=torch.bfloat16))
    slots = run_mod.probe_task(task, 1, run_mod.CodeCache())
    assert slots["theirs"].runs.tolist() == [] and slots["mine"].runs.tolist() == [[0, 0, 24]]
    assert slots["both"].runs.tolist() == [[0, 0, 24]] and decoded == [torch.Size([8, 6])]


@pytest.mark.parametrize("how", ["chunk", "rows", "flip", "raises-on-blank"])
def test_unfilled_codes_give_the_filled_codes_runs(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large shard is first probed with unfilled codes: outputs that are views get the runs the filled codes
    give; anything else (a copy, a mapping that fails on the unfilled values) is probed again with filled codes."""
    from types import SimpleNamespace

    from convcheck import compat
    from convcheck.probe import run as run_mod

    compat.install_import_shims()

    class Mapping:
        def megatron_to_hf(self, weights: torch.Tensor, module: object) -> dict[str, torch.Tensor]:
            if how == "chunk":
                gate, up = torch.chunk(weights, 2, dim=0)
                return {"gate": gate, "up": up}
            if how == "rows":
                return {"w": weights[1:-3]}
            if how == "raises-on-blank" and not bool(weights.reshape(-1)[:4].eq(torch.arange(1, 5)).all()):
                raise ValueError("values the mapping did not expect")
            return {"w": weights.flip(0).contiguous()}

    task = SimpleNamespace(mapping=Mapping(), megatron_module=None, param_weight=torch.zeros(64, 48))
    filled_codes: list[tuple[int, ...]] = []
    real_codes = run_mod.shard_codes
    monkeypatch.setattr(run_mod, "shard_codes", lambda *a: (filled_codes.append(a[0]), real_codes(*a))[1])
    monkeypatch.setattr(run_mod, "UNFILLED_MIN", 1)
    blank = {n: s.runs.tolist() for n, s in run_mod.probe_task(task, 0).items()}
    assert bool(filled_codes) == (how in ("flip", "raises-on-blank"))  # views never wrote their codes
    monkeypatch.setattr(run_mod, "UNFILLED_MIN", 1 << 40)
    filled = {n: s.runs.tolist() for n, s in run_mod.probe_task(task, 0).items()}
    assert blank == filled and filled
