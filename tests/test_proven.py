"""convcheck.compare.proven: byte ranges one compare proved equal stand in for a second compare of exactly those
ranges, and for nothing else (another range, a written tensor, a forgotten step)."""

from __future__ import annotations

import torch

from convcheck.compare.bits import bytes_equal, same_tensor
from convcheck.compare.proven import ProvenBytes
from convcheck.probe.collect import _against_real
from convcheck.probe.run import ProbeSlot


def _pair() -> tuple[torch.Tensor, torch.Tensor]:
    weight = torch.arange(32, dtype=torch.bfloat16).reshape(8, 4)
    real = weight[4:].clone()  # rows 4..7 of the weight, in new memory (as a gather returns them)
    return real, weight


def test_a_noted_range_is_known_both_ways_and_counted() -> None:
    real, weight = _pair()
    proven = ProvenBytes()
    proven.note(real, 0, weight, 16, 16)
    assert proven.known(real, weight[4:]) and proven.known(weight[4:], real)
    assert proven.hits == 2


def test_other_ranges_written_tensors_and_forgotten_steps_are_unknown() -> None:
    real, weight = _pair()
    proven = ProvenBytes()
    proven.note(real, 0, weight, 16, 16)
    assert not proven.known(real, weight[:4])  # the same byte count elsewhere in the weight
    assert not proven.known(real[:2], weight[4:6])  # a part of the proved range is not looked up as proved
    weight[0, 0] += 1  # an in-place write anywhere in the weight moves the version counter its views share
    assert not proven.known(real, weight[4:])
    proven.note(real, 0, weight, 16, 16)
    proven.clear()
    assert not proven.known(real, weight[4:])
    assert proven.hits == 0


def test_non_contiguous_tensors_are_not_noted() -> None:
    weight = torch.arange(32, dtype=torch.int16).reshape(4, 8)
    column = weight[:, :4]  # rows of 8, 4 taken: flat index is not memory offset
    proven = ProvenBytes()
    proven.note(column, 0, weight, 0, 16)
    assert not proven.known(weight[:2], weight[:2].clone())
    assert not proven._facts


def test_bytes_equal_does_not_read_a_pair_it_is_told_is_proved() -> None:
    real, weight = _pair()
    other = torch.zeros_like(real)
    proven = ProvenBytes()
    proven.note(other, 0, weight, 16, 16)  # a false fact: the compare trusts it (what a fact is for)
    assert bytes_equal(other, weight[4:], proven) and same_tensor(other, weight[4:], proven)
    assert not bytes_equal(other, weight[4:])  # without it the bytes are read and differ


def test_the_differential_notes_only_what_its_compare_proved() -> None:
    real, weight = _pair()
    slot = ProbeSlot(hf_name="x", shape=(4, 4), runs=torch.tensor([[0, 16, 16]]), writer=(("ep", 0),))
    proven = ProvenBytes()
    assert "mismatch" not in _against_real(real, slot, weight, proven=proven)
    assert proven.known(real, weight[4:])
    wrong = real.clone()
    wrong.view(torch.int16)[1, 2] ^= 1  # one bit of one element
    proven.clear()
    out = _against_real(wrong, slot, weight, proven=proven)
    assert out["mismatch"]["first"] == [1, 2] and out["mismatch"]["count"] == 1
    assert not proven._facts  # a compare that found a difference proves nothing
