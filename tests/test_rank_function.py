"""`convcheck.api.run_in_ranks`: a user function runs in every rank of the loaded sharded model."""

from __future__ import annotations

from typing import Any

import pytest

from convcheck.api import run_in_ranks
from convcheck.errors import BadInput


def shard_shapes(ctx: Any, prefix: str) -> dict[str, Any]:
    """Every rank's shard shapes of parameters starting with `prefix`, gathered to rank 0."""
    mine = {name: list(t.shape) for name, t in ctx.named_parameters() if name.startswith(prefix)}
    return {"world": ctx.world, "tp_size": ctx.group("tp").size(), "shards": ctx.gather((ctx.coord.tp_rank, mine))}


@pytest.mark.ranks
def test_function_sees_every_rank_of_the_loaded_model() -> None:
    out = run_in_ranks(f"{__file__}:shard_shapes", "tiny:qwen3", "tp2", kwargs={"prefix": "decoder.layers.0.mlp"})
    assert out["world"] == 2 and out["tp_size"] == 2
    assert [tp for tp, _ in out["shards"]] == [0, 1]
    for _, shapes in out["shards"]:  # fc1 is [2*ffn/tp, hidden] = [64, 32]; fc2 [hidden, ffn/tp] = [32, 32]
        assert shapes == {  # the TE layout run_in_ranks builds by default: the pre-MLP norm lives in linear_fc1
            "decoder.layers.0.mlp.linear_fc1.layer_norm_weight": [32],
            "decoder.layers.0.mlp.linear_fc1.weight": [64, 32],
            "decoder.layers.0.mlp.linear_fc2.weight": [32, 32],
        }


def test_function_spec_is_checked_before_any_rank_starts() -> None:
    with pytest.raises(BadInput, match="MODULE:FUNCTION"):
        run_in_ranks("no-colon", "tiny:qwen3")
