"""The gated norm's value map through the probe: planted bugs in RMSNorm2ZeroCenteredRMSNormMapping (the real bridge
class) named by tensor and first wrong element, with every oracle's verdict asserted."""

from pathlib import Path

import pytest

from tests.support.helpers import mutant, run_cli

ORACLES = ("--oracle", "coverage,roundtrip,differential,elements")
NORM = "model.layers.{}.linear_attn.norm.weight"


def _findings(res, oracle: str) -> dict[str, tuple[str, list[int]]]:  # type: ignore[no-untyped-def]
    return {f["tensor"]: (f["kind"], f["detail"].get("first_index")) for f in res.findings(oracle)}


@pytest.mark.ranks
@pytest.mark.parametrize(
    ("hook", "layer", "first"),
    [("norm_offset_twice", 2, [0]), ("norm_elements_reversed", 1, [0])],
)
def test_gated_norm_value_bugs_are_named(hook: str, layer: int, first: list[int], tmp_path: Path) -> None:
    res = run_cli("verify", *ORACLES, "--model", "tiny:qwen3-next", "--hook", mutant("gdn", hook), tmp_path=tmp_path)
    assert res.code == 1, res.err
    assert res.verdicts() == {"coverage": "pass", "roundtrip": "fail", "differential": "fail", "elements": "pass"}
    name = NORM.format(layer)
    assert _findings(res, "roundtrip") == {name: ("bytes-differ", first)}
    assert _findings(res, "differential") == {name: ("differs", first)}
    (diff,) = res.findings("differential")
    assert "after x + 1 (RMSNorm2ZeroCenteredRMSNormMapping)" in diff["message"]
    assert f"decoder.layers.{layer}.self_attention.out_norm.weight" in diff["message"]
