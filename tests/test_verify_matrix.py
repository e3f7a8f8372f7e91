"""`convcheck verify` passes for every fixture at every layout on CPU, one torchrun launch per case."""

import math
from pathlib import Path

import pytest

from convcheck.checkpoint import open_checkpoint
from convcheck.fixtures import FIXTURES, build_fixture
from tests.helpers import run_cli

DENSE_LAYOUTS = [(), ("--tp", "2"), ("--pp", "2")]
MOE_LAYOUTS = [("--ep", "2"), ("--tp", "2", "--ep", "2")]
HYBRID_LAYOUTS = [(), ("--tp", "2"), ("--ep", "2")]
RELEASE_VARIANTS = ("qwen3-moe-unnorm", "nemotron-h-moe")  # knobs for older bridge releases: tests/test_releases.py
DENSE = [name for name in sorted(FIXTURES) if name not in ("nemotron-h", *RELEASE_VARIANTS)]
CASES = (
    [(name, layout) for name in DENSE for layout in DENSE_LAYOUTS]
    + [("qwen3-moe", layout) for layout in MOE_LAYOUTS]
    + [("nemotron-h", layout) for layout in HYBRID_LAYOUTS]
    + [("qwen2", ("--tp", "4"))]  # fewer KV heads (2) than TP ranks (4): each query group split over two ranks
)


@pytest.mark.ranks
@pytest.mark.parametrize(("name", "layout"), CASES, ids=[f"{n}-{'-'.join(lay) or 'tp1'}" for n, lay in CASES])
def test_verify_passes(name: str, layout: tuple[str, ...], tmp_path: Path) -> None:
    res = run_cli("verify", "--model", f"tiny:{name}", *layout, "--table", "failures", tmp_path=tmp_path)
    assert res.code == 0, res.out[-3000:] + res.err[-2000:]
    report = res.report
    assert report is not None
    assert report["verdict"] == "pass"
    assert report["model"] == f"tiny:{name}"
    assert set(report["versions"]) >= {"torch", "megatron-core", "megatron-bridge", "transformers"}
    assert report["versions"]["megatron-core"] == "0.19.2"
    assert {"coverage", "roundtrip"} <= {o["name"] for o in report["oracles"]}
    for oracle in report["oracles"]:
        assert oracle["verdict"] == "pass" and oracle["checked"] > 0 and oracle["findings"] == []
    oracles = {o["name"]: o for o in report["oracles"]}
    assert oracles["roundtrip"]["checked"] == len(oracles["roundtrip"]["tensors"])
    numel = sum(math.prod(e.shape) for e in open_checkpoint(build_fixture(f"tiny:{name}")).tensors.values())
    for name_ in ("differential", "elements"):  # every element of every source tensor proven, per task
        if name_ in oracles:
            assert oracles[name_]["checked"] == numel and oracles[name_]["unit"] == "elements"
    if "layout" in oracles:
        assert oracles["layout"]["checked"] == oracles["roundtrip"]["checked"]
    assert "PASS" in res.out.strip().splitlines()[-1]
