"""The mapping oracle ships shards to rank 0 in byte-budgeted batches: few gathers, the same verdict at any budget."""

from pathlib import Path

import pytest

from convcheck.oracles.mapping import batches
from tests.helpers import run_cli

BUDGET_HOOK = Path(__file__).with_name("hooks_mapping_budget.py")


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
    assert res.code == 0, res.err
    return next(o for o in res.report["oracles"] if o["name"] == "mapping")


@pytest.mark.ranks
def test_gathers_follow_bytes_not_parameters(tmp_path: Path) -> None:
    batched = _mapping(tmp_path / "default")
    one_each = _mapping(tmp_path / "tiny-budget", "--hook", f"{BUDGET_HOOK}:one_byte")
    params = sum(1 for t in batched["tensors"] if t["verdict"] == "pass")
    assert batched["metrics"]["gathers"] == 1  # the whole tiny model fits one 64 MiB batch
    assert one_each["metrics"]["gathers"] >= params // 2 > 1  # every rebuilt parameter alone
    for key in ("verdict", "checked", "unit", "findings", "tensors"):
        assert batched[key] == one_each[key], key
