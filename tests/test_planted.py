"""Planted bugs through the real bridge classes: verify must fail (exit 1) and name the tensor."""

from pathlib import Path
from xml.etree import ElementTree

import pytest

from tests.support.helpers import mutant, run_cli

BASE = ("--oracle", "coverage,roundtrip")


def _kinds(res, oracle: str) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
    out: dict[str, set[str]] = {}
    for f in res.findings(oracle):
        out.setdefault(f["tensor"], set()).add(f["kind"])
    return out


@pytest.mark.ranks
def test_swapped_qk_head_is_caught_with_first_element(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    res = run_cli("verify", *BASE, "--model", "tiny:qwen3", "--tp", "2", "--hook", mutant("bridge", "swap_qk_head0"),
                  "--junit", str(junit), tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    assert res.verdicts()["roundtrip"] == "fail"
    q = next(f for f in res.findings("roundtrip") if f["tensor"] == "model.layers.0.self_attn.q_proj.weight")
    assert q["kind"] == "bytes-differ"
    assert q["detail"]["first_index"] == [0, 0]
    assert q["detail"]["count"] == 8 * 32
    assert "model.layers.0.self_attn.k_proj.weight" in _kinds(res, "roundtrip")
    assert "model.layers.0.self_attn.q_proj.weight" in res.out
    hook = mutant("bridge", "swap_qk_head0")
    assert f"replay: convcheck verify --model tiny:qwen3 --tp 2 --oracle roundtrip --hook {hook}" in res.out
    suite = ElementTree.parse(junit).getroot()
    assert suite.get("failures") == "1"
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["roundtrip"]


@pytest.mark.ranks
def test_dropped_expert_is_caught_under_ep(tmp_path: Path) -> None:
    res = run_cli(
        "verify",
        *BASE,
        "--model",
        "tiny:qwen3-moe",
        "--ep",
        "2",
        "--hook",
        mutant("bridge", "drop_expert3"),
        tmp_path=tmp_path,
    )
    assert res.code == 1
    names = {f"model.layers.1.mlp.experts.3.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert {t for t, k in _kinds(res, "coverage").items() if "not-exported" in k} == names
    assert {t for t, k in _kinds(res, "roundtrip").items() if "missing" in k} == names


@pytest.mark.ranks
def test_transposed_weight_is_caught(tmp_path: Path) -> None:
    res = run_cli(
        "verify", *BASE, "--model", "tiny:llama", "--hook", mutant("bridge", "transpose_o_proj"), tmp_path=tmp_path
    )
    assert res.code == 1
    assert _kinds(res, "roundtrip") == {"model.layers.0.self_attn.o_proj.weight": {"bytes-differ"}}
    assert res.verdicts()["coverage"] == "pass"


@pytest.mark.ranks
def test_duplicated_name_is_caught(tmp_path: Path) -> None:
    res = run_cli(
        "verify",
        *BASE,
        "--model",
        "tiny:qwen2",
        "--tp",
        "2",
        "--hook",
        mutant("bridge", "duplicate_name"),
        tmp_path=tmp_path,
    )
    assert res.code == 1
    assert _kinds(res, "coverage") == {"model.norm.weight": {"duplicate"}}


@pytest.mark.ranks
def test_dtype_change_is_caught(tmp_path: Path) -> None:
    res = run_cli("verify", *BASE, "--model", "tiny:qwen3", "--hook", mutant("bridge", "dtype_change"),
                  tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1
    f = res.findings("roundtrip")
    assert [(x["tensor"], x["kind"]) for x in f] == [("model.layers.0.post_attention_layernorm.weight", "dtype")]
    assert "float32" in f[0]["message"] and "bfloat16" in f[0]["message"]


@pytest.mark.ranks
def test_parameter_left_at_init_is_caught(tmp_path: Path) -> None:
    hook = mutant("bridge", "skip_load_final_norm")
    res = run_cli("verify", *BASE, "--model", "tiny:qwen3-moe", "--tp", "2", "--hook", hook, tmp_path=tmp_path)
    assert res.code == 1
    assert _kinds(res, "coverage") == {"decoder.final_layernorm.weight": {"not-loaded"}}
    assert _kinds(res, "roundtrip") == {"model.norm.weight": {"bytes-differ"}}


@pytest.mark.ranks
def test_unmapped_parameter_is_an_error_not_a_warning(tmp_path: Path) -> None:
    res = run_cli("verify", *BASE, "--model", "tiny:qwen3-moe", "--ep", "2", "--hook", mutant("bridge", "unmap_router"),
                  tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1
    kinds = _kinds(res, "coverage")
    assert "unmapped" in kinds["decoder.layers.0.mlp.router.weight"]
    assert "not-loaded" in kinds["decoder.layers.0.mlp.router.weight"]
