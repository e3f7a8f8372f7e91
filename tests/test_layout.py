"""ParallelLayout: world size, labels and the impossible layouts it must reject."""

import pytest

from convcheck.errors import BadInput
from convcheck.layout import ParallelLayout

MOE = {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "num_experts": 8,
       "intermediate_size": 64, "moe_intermediate_size": 16}  # fmt: skip
HYBRID = {"num_attention_heads": 4, "num_key_value_heads": 2, "mamba_num_heads": 4, "n_groups": 2,
          "layers_block_type": ["mamba", "attention", "mlp", "mamba", "moe"], "n_routed_experts": 4}  # fmt: skip
DENSE = {k: v for k, v in MOE.items() if k not in ("num_experts", "moe_intermediate_size")}


@pytest.mark.parametrize(
    ("layout", "world", "label"),
    [
        (ParallelLayout(), 1, "TP1"),
        (ParallelLayout(tp=2), 2, "TP2"),
        (ParallelLayout(tp=2, ep=2), 2, "TP2xEP2"),
        (ParallelLayout(ep=2, etp=2), 4, "EP2xETP2"),
        (ParallelLayout(tp=2, pp=2), 4, "TP2xPP2"),
    ],
)
def test_world_size_and_label(layout: ParallelLayout, world: int, label: str) -> None:
    assert layout.world_size == world
    assert layout.label == label
    assert ParallelLayout.from_dict(layout.to_dict()) == layout


@pytest.mark.parametrize(
    ("layout", "config", "needle"),
    [
        (ParallelLayout(tp=3), DENSE, "does not divide num_attention_heads"),
        (ParallelLayout(tp=2), {**DENSE, "num_attention_heads": 6, "num_key_value_heads": 3}, "num_key_value_heads=3"),
        (ParallelLayout(pp=4), DENSE, "does not divide num_hidden_layers=2"),
        (ParallelLayout(ep=2), DENSE, "has no experts"),
        (ParallelLayout(ep=3), MOE, "does not divide num_experts=8"),
        (ParallelLayout(etp=3), MOE, "does not divide moe_intermediate_size=16"),
        (ParallelLayout(pp=2), HYBRID, "does not divide num_hidden_layers=5"),
        (ParallelLayout(tp=8), {**HYBRID, "num_key_value_heads": 8, "num_attention_heads": 8}, "mamba_num_heads=4"),
    ],
)
def test_impossible_layouts(layout: ParallelLayout, config: dict, needle: str) -> None:
    with pytest.raises(BadInput, match=needle):
        layout.validate_for(config)


def test_fewer_kv_heads_than_tp_is_legal() -> None:
    ParallelLayout(tp=4).validate_for(DENSE)  # Megatron-Core splits each of the 2 KV groups over 2 ranks


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_non_positive_sizes(bad: object) -> None:
    with pytest.raises(BadInput, match="positive integer"):
        ParallelLayout(tp=bad)  # type: ignore[arg-type]


def test_every_broken_constraint_is_named_in_one_line() -> None:
    config = {**DENSE, "num_attention_heads": 6, "num_key_value_heads": 3, "num_hidden_layers": 3}
    with pytest.raises(BadInput) as caught:
        ParallelLayout(tp=4, pp=2).validate_for(config)
    message = str(caught.value)
    assert message.startswith("impossible layout TP4xPP2: tp=4 does not divide num_attention_heads=6; ")
    assert "num_key_value_heads=3" in message and "num_hidden_layers=3" in message and "\n" not in message
