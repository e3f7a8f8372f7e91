"""Shim 25: float8 collectives over gloo as uint8 views (convcheck/compat/no_nccl.py). Each test owns a one-rank gloo
group (a FileStore in its tmp_path), which is enough: gloo refuses the dtype before any peer is involved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from convcheck import compat
from convcheck.compat import no_nccl


@pytest.fixture
def gloo(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _fp8() -> torch.Tensor:
    return torch.tensor([0.5, -448.0, 3.0, 0.0], dtype=torch.float32).to(torch.float8_e4m3fn)


def test_shim25_still_needed_gloo_refuses_float8(gloo: None) -> None:
    """Fails once torch's gloo carries float8 (then delete shim 25)."""
    with pytest.raises(RuntimeError, match="Invalid scalar type"):
        compat.upstream(dist.all_gather)([torch.empty_like(_fp8())], _fp8())
    with pytest.raises(RuntimeError, match="Invalid scalar type"):
        compat.upstream(dist.broadcast)(_fp8(), src=0)


def test_shim25_moves_the_same_bytes(gloo: None) -> None:
    no_nccl.install()
    x = _fp8()
    out = [torch.empty_like(x)]
    dist.all_gather(out, x)
    assert out[0].dtype == torch.float8_e4m3fn and out[0].view(torch.uint8).tolist() == x.view(torch.uint8).tolist()
    y = x.clone()
    dist.broadcast(y, src=0)
    assert y.view(torch.uint8).tolist() == x.view(torch.uint8).tolist()
    plain = [torch.empty(2)]
    dist.all_gather(plain, torch.tensor([1.5, 2.5]))  # any other dtype runs upstream unchanged
    assert plain[0].tolist() == [1.5, 2.5]
    assert no_nccl.install() is None and compat.upstream(dist.all_gather) is not dist.all_gather
