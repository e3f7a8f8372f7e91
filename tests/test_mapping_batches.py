"""The mapping oracle ships shards to rank 0 in byte-budgeted batches: few gathers, the same verdict at any budget."""

from pathlib import Path

import pytest

from convcheck.oracles.mapping import batches
from tests.support.helpers import mutant, run_cli

BUDGET_HOOK = Path(__file__).parent / "support" / "hooks_mapping_budget.py"


def test_batches_respect_the_budget_and_keep_order() -> None:
    sizes = {"a": 3, "b": 3, "c": 5, "d": 1, "e": 1}
    assert batches(list("abcde"), sizes, 6) == [["a", "b"], ["c", "d"], ["e"]]
    assert batches(list("abcde"), sizes, 1) == [["a"], ["b"], ["c"], ["d"], ["e"]]  # larger ones go alone
    assert batches(list("abcde"), sizes, 1 << 30) == [list("abcde")]
    assert batches([], sizes, 6) == []


def _mapping(tmp_path: Path, *hook: str) -> dict:
    tmp_path.mkdir(parents=True)
    res = run_cli("verify", "--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "2", "--oracle", "mapping", *hook,
                  tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    return next(o for o in res.report["oracles"] if o["name"] == "mapping")


@pytest.mark.ranks
def test_gathers_follow_bytes_not_parameters(tmp_path: Path) -> None:
    """Only parameters with a wrong shard are gathered and rebuilt (here both layers' QKV, made wrong the same way in
    import and export), in one batch by default and one gather each at a 1-byte budget, with the same verdict."""
    planted = ("--hook", mutant("symmetric", "qk_order_swapped"))
    batched = _mapping(tmp_path / "default", *planted)
    one_each = _mapping(tmp_path / "tiny-budget", *planted, "--hook", f"{BUDGET_HOOK}:one_byte")
    assert batched["metrics"]["rebuilt_from_shards"] == one_each["metrics"]["rebuilt_from_shards"] == 2
    assert batched["metrics"]["gathers"] == 2  # the rebuild, then the localising rebuild: one batch each
    assert one_each["metrics"]["gathers"] == 4  # every rebuilt parameter alone
    for key in ("verdict", "checked", "unit", "findings", "tensors"):
        assert batched[key] == one_each[key], key
