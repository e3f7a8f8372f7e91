"""Fixtures: offline, deterministic, sharded, distinct values within every tensor, reused from the cache."""

import json

import pytest
import torch
from safetensors import safe_open

from convcheck.compare.bits import int_view
from convcheck.fixtures import FIXTURES, get_spec
from convcheck.fixtures.build import build_fixture
from convcheck.fixtures.specs import ENGINE_VARIANTS
from convcheck.fixtures.values import distinct_values
from convcheck.hf.checkpoint import open_checkpoint
from convcheck.models.fixture_spec import POOL_SIZE
from tests.support.helpers import run_cli


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_is_sharded_bf16_with_distinct_values(name: str) -> None:
    folder = build_fixture(f"tiny:{name}")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    ckpt = open_checkpoint(folder)
    spec = get_spec(name)
    fp32, block = spec.fp32_tensors, spec.block_amax
    amaxes = []
    for tname, entry in ckpt.tensors.items():
        with safe_open(str(folder / entry.file), "pt") as fh:
            t = fh.get_tensor(tname)
        assert t.dtype == (torch.float32 if fp32 and tname.endswith(fp32) else torch.bfloat16), tname
        if block and t.dim() == 2:  # drawn block by block under a cap of its own (values.capped_blocks)
            amaxes += [_block_checked(tname, t[r : r + block, c : c + block]) for r, c in _corners(t, block)]
            continue
        if name in ENGINE_VARIANTS:  # CPU vLLM's widths: a tensor (or the fused experts it was split from) may
            # outgrow the pool, whose values then come round again: most still distinct
            distinct = int_view(t).unique().numel()
            assert distinct >= 0.85 * min(t.numel(), POOL_SIZE), f"{tname} has {distinct} distinct of {t.numel()}"
            continue
        assert t.numel() <= POOL_SIZE, f"{tname} is too large for distinct values"
        assert int_view(t).unique().numel() == t.numel(), f"{tname} has repeated values"
    assert not block or len(set(amaxes)) > 0.8 * len(amaxes)  # caps drawn from 512: a few blocks share one


CAPPED_POOL = 19 * 128 * 2
"""The fewest values a capped block draws from: every pool magnitude below 0.5 (19 exponents x 128 mantissas x 2
signs), and those up to its cap."""


def _corners(t: torch.Tensor, block: int) -> list[tuple[int, int]]:
    return [(r, c) for r in range(0, t.shape[0], block) for c in range(0, t.shape[1], block)]


def _block_checked(name: str, values: torch.Tensor) -> int:
    """A capped block's values are distinct up to its capped pool; its amax's bits."""
    assert int_view(values).unique().numel() >= min(values.numel(), CAPPED_POOL), f"{name} has repeated values"
    return int(int_view(values.abs().max().reshape(1))[0])


def test_tied_fixture_has_no_lm_head() -> None:
    ckpt = open_checkpoint(build_fixture("tiny:qwen2-tied"))
    assert "lm_head.weight" not in ckpt.tensors
    assert ckpt.config["tie_word_embeddings"] is True


def test_moe_fixture_shape() -> None:
    ckpt = open_checkpoint(build_fixture("tiny:qwen3-moe"))
    assert ckpt.config["num_experts"] >= 8 and ckpt.config["num_experts_per_tok"] == 2  # the spelling 4.57 reads
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in ckpt.tensors


def test_values_are_deterministic_and_name_dependent() -> None:
    a = distinct_values((16, 8), "x", 1, torch.bfloat16)
    assert torch.equal(int_view(a), int_view(distinct_values((16, 8), "x", 1, torch.bfloat16)))
    assert not torch.equal(int_view(a), int_view(distinct_values((16, 8), "y", 1, torch.bfloat16)))


def test_reuse_and_cli(tmp_path) -> None:  # type: ignore[no-untyped-def]
    first = build_fixture("tiny:llama")
    stamp = (first / ".complete").stat().st_mtime_ns
    assert build_fixture("tiny:llama") == first
    assert (first / ".complete").stat().st_mtime_ns == stamp
    listed = run_cli("fixtures", "list")
    assert listed.code == 0 and all(f"tiny:{n}" in listed.out for n in FIXTURES)
    built = run_cli("fixtures", "build", "tiny:qwen3", "--out", str(tmp_path / "q3"))
    assert built.code == 0
    assert built.out.strip().splitlines()[-1] == str(tmp_path / "q3")
    assert open_checkpoint(tmp_path / "q3").architecture == "Qwen3ForCausalLM"
    unknown = run_cli("fixtures", "build", "tiny:nope")
    assert unknown.code == 2 and "unknown fixture" in unknown.err
