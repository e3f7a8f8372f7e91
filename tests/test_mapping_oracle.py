"""The mapping oracle through the real CLI: clean models pass; a bug made identically in import and export
(invisible to roundtrip) is caught, naming the parameter and its first differing element."""

from pathlib import Path

import pytest

from tests.support.helpers import matrix_run, mutant, run_cli


@pytest.mark.ranks
def test_mapping_oracle_passes_qwen3_moe_tp2_ep2(shared_root: Path) -> None:
    res, _ = matrix_run(shared_root, "qwen3-moe", ("--tp", "2", "--ep", "2"))  # the verify-matrix run of this case
    assert res.code == 0, res.err
    oracle = next(o for o in res.report["oracles"] if o["name"] == "mapping")
    assert oracle["verdict"] == "pass" and oracle["checked"] > 0
    assert oracle["metrics"]["gathers"] == oracle["metrics"]["rebuilt_from_shards"] == 0  # every shard matched
    assert oracle["metrics"]["export_vs_source"] == 69  # every HF tensor, each against the source
    assert oracle["metrics"]["export"] == "shared (roundtrip)"  # roundtrip's drain answered it: no drain of its own
    assert oracle["metrics"]["rank0_shards_in_roundtrip"] == "33/33"  # rank 0's shards proven on roundtrip's reads
    rows = {t["tensor"]: t["verdict"] for t in oracle["tensors"]}
    assert rows["decoder.layers.0.self_attention.linear_qkv.weight"] == "pass"
    assert rows["decoder.layers.1.mlp.experts.local_experts.7.linear_fc1.weight"] == "pass"  # global expert id
    assert rows["embedding.word_embeddings.weight"] == "pass"


@pytest.mark.ranks
def test_mapping_oracle_passes_qwen2_qkv_bias_tp2(shared_root: Path) -> None:
    res, _ = matrix_run(shared_root, "qwen2", ("--tp", "2"))  # the verify-matrix run of this case
    assert res.code == 0, res.err
    oracle = next(o for o in res.report["oracles"] if o["name"] == "mapping")
    rows = {t["tensor"]: t["verdict"] for t in oracle["tensors"]}
    assert rows["decoder.layers.0.self_attention.linear_qkv.bias"] == "pass"
    assert set(rows.values()) == {"pass"}


@pytest.mark.ranks
def test_symmetric_qkv_bug_passes_roundtrip_but_not_mapping(tmp_path: Path) -> None:
    res = run_cli("verify", "--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "2", "--oracle", "roundtrip,mapping",
                  "--hook", mutant("symmetric", "qk_order_swapped"), tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    assert res.verdicts() == {"roundtrip": "pass", "mapping": "fail"}
    first = res.findings("mapping")[0]
    assert first["tensor"] == "decoder.layers.0.self_attention.linear_qkv.weight"
    assert first["kind"] == "import-bytes-differ"
    assert first["detail"]["first_index"] == [0, 0]
    assert "first at index [0, 0]" in first["message"]
    kinds = {(f["tensor"], f["kind"]) for f in res.findings("mapping")}
    for i in (0, 1):
        assert (f"decoder.layers.{i}.self_attention.linear_qkv.weight", "import-bytes-differ") in kinds
        for proj in ("q", "k"):  # the export rebuilt from the loaded shards differs from the bridge's too
            assert (f"model.layers.{i}.self_attn.{proj}_proj.weight", "export-bytes-differ") in kinds
    assert all("linear_qkv" in t or "_proj.weight" in t for t, _ in kinds)
    metrics = next(o for o in res.report["oracles"] if o["name"] == "mapping")["metrics"]
    assert metrics["rank0_shards_in_roundtrip"] == "31/33"  # both qkv shards were left to the oracle's own check


HOOKS = Path(__file__).parent / "support" / "hooks_mapping_inverse.py"


def test_from_shards_that_is_not_to_shards_inverse_is_named(tmp_path: Path) -> None:
    """The export is wrong and convcheck's own mapping rebuilds the same wrong tensor from shards that match its
    to_shard: the finding blames the mapping (not to_shard's inverse), not the bridge's export."""
    res = run_cli("verify", "--model", "tiny:llama", "--oracle", "roundtrip,mapping",
                  "--hook", f"{HOOKS}:transposed_o_proj_both", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    assert res.verdicts() == {"roundtrip": "fail", "mapping": "fail"}
    findings = res.findings("mapping")
    assert [(f["tensor"], f["kind"]) for f in findings] == [
        ("model.layers.0.self_attn.o_proj.weight", "mapping-not-inverse")
    ]
    assert "from_shards is not to_shard's inverse" in findings[0]["message"]
    assert res.findings("roundtrip")[0]["tensor"] == "model.layers.0.self_attn.o_proj.weight"
