"""`verify --pad-vocab N`: the padded vocabulary training uses, through the real bridge and every oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

from convcheck.api import check_pad_vocab
from convcheck.errors import BadInput
from tests.support.helpers import mutant, run_cli


@pytest.mark.parametrize("value", [0, -128, True, 1.5])
def test_pad_vocab_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(BadInput, match="--pad-vocab must be a positive integer"):
        check_pad_vocab(value)  # type: ignore[arg-type]


def test_pad_vocab_zero_is_one_line_exit_2() -> None:
    res = run_cli("verify", "--model", "tiny:qwen3", "--pad-vocab", "0")
    assert res.code == 2 and res.err.count("\n") == 1 and "--pad-vocab" in res.err, res.err


@pytest.mark.ranks
def test_export_trimmed_too_far_under_padding_is_named(tmp_path: Path) -> None:
    """With the candidate padding fix (TP1 import pads, export trims), trimming 8 real rows too many is named;
    every other tensor round-trips, so the padded rows themselves cause no false alarm."""
    hook = mutant("padding", "fix_vocab_padding_trim_too_far")
    oracles = "coverage,roundtrip,mapping"
    res = run_cli("verify", "--model", "tiny:qwen2-tied", "--pad-vocab", "128", "--oracle", oracles,
                  "--hook", hook, tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    roundtrip = res.findings("roundtrip")
    assert [(f["tensor"], f["kind"]) for f in roundtrip] == [("model.embed_tokens.weight", "shape")]
    assert "shape [144, 32], expected [152, 32]" in roundtrip[0]["message"]
    assert "8 rows dropped along dim 0" in roundtrip[0]["message"]
    assert {(f["tensor"], f["kind"]) for f in res.findings("mapping")} == {
        ("model.embed_tokens.weight", "export-shape")
    }
    assert res.verdicts()["coverage"] == "pass"
