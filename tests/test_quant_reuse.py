"""convcheck.quant.reuse: a reference assembled from the quantized export's own quant_fn results is, bitwise, the
reference quantizer applied to the tensor itself, for every way the bridge lays HF tensors out in a Megatron weight
(the same tensor, stacked halves, interleaved block rows); anything else is quantized afresh."""

from __future__ import annotations

import pytest
import torch

from convcheck.quant import reference as ref
from convcheck.quant.reuse import BlockReuse

B = (4, 4)


def blocks(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A bf16 [rows, cols] weight whose every 4 x 4 block has its own amax."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    scale = torch.rand(rows // 4, cols // 4 + (cols % 4 > 0), generator=g) * 8 + 0.1
    return (x * scale.repeat_interleave(4, 0).repeat_interleave(4, 1)[:rows, :cols]).to(torch.bfloat16)


def kept(*weights: torch.Tensor, quantize=ref.fp8_block) -> BlockReuse:  # type: ignore[no-untyped-def]
    reuse = BlockReuse(block=B)
    for w in weights:
        reuse.keep(w, B, *quantize(w, B))
    return reuse


def same(a: tuple[torch.Tensor, torch.Tensor] | None, b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    assert a is not None
    return torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(
        a[1].view(torch.int32), b[1].view(torch.int32)
    )


@pytest.mark.parametrize("quantize", [ref.fp8_block, ref.fp8_ue8m0, ref.fp8_nemo_rl])
def test_assembled_references_are_the_reference_bitwise(quantize) -> None:  # type: ignore[no-untyped-def]
    cols = 8 if quantize is ref.fp8_nemo_rl else 10  # NeMo-RL needs whole blocks; the others pad the edge
    gate, up, q, k, v, o = (blocks(8, cols, seed) for seed in range(6))
    fc1 = torch.cat([gate, up])  # a fused gate/up weight
    qkv = torch.cat([q[:4], k[:4], v[:4], q[4:], k[4:], v[4:]])  # interleaved per query group (head_dim = block)
    reuse = kept(fc1, qkv, o, quantize=quantize)
    for x in (gate, up, q, k, v, o):
        assert same(reuse.reference(x), quantize(x, B))
    assert reuse.hits == 6
    whole = reuse.reference(o)
    assert whole is not None and whole[0].data_ptr() == reuse.kept[2].q.data_ptr()  # a slice, not a copy


def test_anything_that_does_not_match_is_quantized_afresh() -> None:
    w = blocks(8, 8, 0)
    reuse = kept(w)
    other = w.clone()
    other[5, 3] = other[5, 3] + 1  # one element of block row 1 differs
    assert reuse.reference(other) is None
    assert reuse.reference(w[:6]) is None  # rows the block does not divide
    assert reuse.reference(w[:, :4].contiguous()) is None  # another width
    assert reuse.reference(w[2:6].contiguous()) is None  # block rows off the block grid of the kept weight
    assert reuse.hits == 0


def test_a_weight_written_since_or_a_result_changed_by_the_bridge_is_not_trusted() -> None:
    w = blocks(8, 8, 1)
    reuse = BlockReuse(block=B)
    q, scale = ref.fp8_block(w, B)
    reuse.keep(w, B, q, scale)
    q.zero_()  # the bridge writes into what quant_fn returned: the kept copy is untouched
    assert same(reuse.reference(w.clone()), ref.fp8_block(w, B))
    w.mul_(1)  # written in place (same values): its version moved
    assert reuse.reference(w.clone()) is None


def test_other_blocks_and_shapes_are_not_kept() -> None:
    reuse = BlockReuse(block=B)
    w = blocks(8, 8, 2)
    reuse.keep(w, (8, 8), *ref.fp8_block(w, (8, 8)))
    reuse.keep(w[:6], B, *ref.fp8_block(w[:6], B))
    assert reuse.kept == [] and reuse.index == {}
