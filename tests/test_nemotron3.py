"""Nemotron-3 (NemotronH with MTP) without ranks: the explicit MTP mappings against the real NemotronHBridge's MTP
flattening and the fixture's own values, planted MTP bugs named by tensor and first wrong element, the config
table's MTP rows, the geometry and the published Super config's shrink.

The rank runs: the gate case nemotron-3-mtp/tp2+te (tests/test_verify_matrix.py), the two catalog mutants
(tests/test_catalog_kills.py), the other layouts in bench/results/cpu-nemotron3-2026-12-07.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import pytest
from megatron.bridge.models.nemotronh import nemotron_h_bridge
from safetensors import safe_open
from transformers import AutoConfig

from convcheck.compare.bits import compare_bits
from convcheck.errors import BadInput
from convcheck.fixtures.build import build_fixture
from convcheck.fixtures.from_config import shrink_file
from convcheck.gate import GOLDEN_DIR
from convcheck.hf.checkpoint import open_checkpoint
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mappings import RankCoord, Replicated, Split
from convcheck.models.mapping_registry import build_registry
from convcheck.models.nemotron_h import NEMOTRON_H_TABLE
from convcheck.models.nemotron_h_mappings import mtp_index
from convcheck.mutants import nemotron3
from convcheck.rank.bringup import _environment_limit

DATA = Path(__file__).parent / "data"
ARCH = "NemotronHForCausalLM"
ENORM, HNORM = "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight"
ATTENTION_NORM = "mtp.layers.0.mtp_model_layer.layers.0.self_attention.linear_qkv.layer_norm_weight"


def _fixture() -> tuple[Path, Geometry, list[str], list[str]]:
    """tiny:nemotron-3-mtp: its folder, geometry, the Megatron parameters of its TE layout (the golden manifest's
    conversion tasks) and its HF tensors."""
    folder = build_fixture("tiny:nemotron-3-mtp")
    ckpt = open_checkpoint(folder)
    tasks = json.loads((GOLDEN_DIR / "nemotron-3-mtp__tp2_te.json").read_text())["tasks"]
    return folder, Geometry.from_hf_config(ckpt.config), sorted(tasks), sorted(ckpt.tensors)


def _tensors(folder: Path, names: list[str]) -> dict[str, Any]:
    ckpt = open_checkpoint(folder)
    out = {}
    for name in names:
        with safe_open(str(folder / ckpt.tensors[name].file), "pt") as fh:
            out[name] = fh.get_tensor(name)
    return out


def _bridge(folder: Path) -> Any:
    """The real NemotronHBridge's mapping registry for the fixture's config."""
    bridge = nemotron_h_bridge.NemotronHBridge()
    bridge.hf_config = AutoConfig.from_pretrained(folder)
    return bridge.mapping_registry()


def test_the_explicit_mappings_map_every_parameter_once_and_agree_with_the_bridges_mtp_flattening() -> None:
    """115 Megatron parameters (28 in the MTP block) and 119 HF tensors, each once; every MTP parameter lands on the
    HF tensor(s) the bridge's _MTPFlatteningMapping / _MTPFlatteningQKVMapping resolve it to."""
    folder, geometry, megatron, hf = _fixture()
    registry = build_registry(ARCH, geometry, megatron, hf)
    assert len(megatron) == 115 and len(hf) == 119 and registry.problems == ()
    tasks = json.loads((GOLDEN_DIR / "nemotron-3-mtp__tp2_te.json").read_text())["tasks"]
    mtp = [name for name in megatron if name.startswith("mtp.")]
    assert len(mtp) == 28
    for name in mtp:
        bridge_hf = tasks[name]["hf"]
        want = tuple(bridge_hf.values()) if isinstance(bridge_hf, dict) else (bridge_hf,)
        assert registry.get(name).hf_names == want, name
    assert registry.get("mtp.layers.0.eh_proj.weight") == Split(
        megatron="mtp.layers.0.eh_proj.weight", hf="mtp.layers.0.eh_proj.weight"
    )
    final = registry.get("mtp.layers.0.final_layernorm.weight")
    assert final == Replicated(megatron=final.megatron, hf="mtp.layers.1.final_layernorm.weight")


def _first_wrong(folder: Path, geometry: Geometry, megatron: str) -> Any:
    """Our mapping's TP1 shard of `megatron` (from the fixture's values) against the tensor the real bridge resolves
    it to: the first differing element, or None."""
    lookup = _bridge(folder).megatron_to_hf_lookup(megatron)
    ours = build_registry(ARCH, geometry, [megatron], [], strict=False).get(megatron)
    hf = _tensors(folder, sorted({*ours.hf_names, lookup.hf_param}))
    return compare_bits(megatron, ours.to_shard(hf, ParallelLayout(), RankCoord()), hf[lookup.hf_param])


@pytest.mark.parametrize(
    ("plant", "megatron"),
    [
        (nemotron3.mtp_enorm_hnorm_swapped, ENORM),
        (nemotron3.mtp_enorm_hnorm_swapped, HNORM),
        (nemotron3.mtp_inner_norms_from_the_other_layer, ATTENTION_NORM),
        (
            nemotron3.mtp_inner_norms_from_the_other_layer,
            "mtp.layers.0.mtp_model_layer.layers.1.pre_mlp_layernorm.weight",
        ),
    ],
)
def test_a_planted_mtp_flattening_bug_is_named_by_tensor_and_first_element(
    plant: Any, megatron: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog's hooks, planted in the real _MTPFlatteningMapping.resolve: the value the bridge then reads for
    the parameter is another MTP tensor's, named with its first element (each norm's values are distinct)."""
    folder, geometry, _, _ = _fixture()
    assert _first_wrong(folder, geometry, megatron) is None  # the bridge as shipped agrees with our mapping
    flattening = nemotron_h_bridge._MTPFlatteningMapping
    monkeypatch.setattr(flattening, "resolve", flattening.resolve)  # restored after the test
    plant()
    finding = _first_wrong(folder, geometry, megatron)
    assert finding is not None and finding.tensor == megatron
    assert finding.detail["first_index"] == [0]


def test_the_bridge_leaves_the_local_specs_mtp_attention_norm_unmapped() -> None:
    """nemotronh-mtp-norm-unmapped: the decoder's separate input_layernorm resolves, the MTP layer's does not; our
    mapping puts it on HF's mtp.layers.0.norm.weight."""
    folder, geometry, _, _ = _fixture()
    bridge = _bridge(folder)
    assert bridge.megatron_to_hf_lookup("decoder.layers.2.input_layernorm.weight").hf_param == (
        "backbone.layers.2.norm.weight"
    )
    local = "mtp.layers.0.mtp_model_layer.layers.0.input_layernorm.weight"
    assert bridge.megatron_to_hf_lookup(local) is None
    ours = build_registry(ARCH, geometry, [local], [], strict=False).get(local)
    assert ours == Replicated(megatron=local, hf="mtp.layers.0.norm.weight")


def test_the_mtp_index_flattens_block_and_inner_layer_and_refuses_an_inner_layer_outside_the_pattern() -> None:
    geometry = Geometry(mtp_layers=2, mtp_layer_types=("attention", "moe"))
    assert [mtp_index(d, i, geometry) for d in (0, 1) for i in (0, 1)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="MTP inner layer 2 outside the 2-layer MTP pattern"):
        mtp_index(0, 2, geometry)


def test_the_geometry_reads_the_mtp_pattern_in_either_spelling() -> None:
    published = json.loads((DATA / "nemotron-3-super-120b-a12b.config.json").read_text())
    assert Geometry.from_hf_config(published).mtp_layer_types == ("attention", "moe")
    written = {**published, "mtp_layers_block_type": ["moe"], "mtp_hybrid_override_pattern": "*E"}
    assert Geometry.from_hf_config(written).mtp_layer_types == ("moe",)  # transformers 5's field wins
    assert Geometry.from_hf_config({**published, "num_nextn_predict_layers": 0}).mtp_layer_types == ()


def _rule(label: str) -> Any:
    return next(r for r in NEMOTRON_H_TABLE if r.label == label)


def test_the_config_table_reads_the_mtp_depth_and_pattern() -> None:
    pattern = _rule("mtp_layers_block_type+num_nextn_predict_layers -> mtp_hybrid_override_pattern")
    one = {"num_nextn_predict_layers": 1, "mtp_layers_block_type": ["attention", "moe"]}
    assert pattern.expect(one, {}.get) == "*E"
    assert pattern.expect({**one, "mtp_layers_block_type": ["moe", "attention"]}, {}.get) == "E*"  # a swap shows
    assert pattern.expect({"num_nextn_predict_layers": 0}, {}.get) is None
    depth = _rule("num_nextn_predict_layers -> mtp_num_layers")
    assert depth.expect(one, {}.get) == 1 and depth.observe(None, {}.get) == 0


def test_the_published_super_config_shrinks_with_mtp_and_latent_moe_kept() -> None:
    shrunk = shrink_file(DATA / "nemotron-3-super-120b-a12b.config.json")
    c = shrunk.spec.config
    assert (c["hybrid_override_pattern"], c["num_nextn_predict_layers"], c["mtp_layers_block_type"]) == (
        "EM*E", 1, ["attention", "moe"]
    )  # fmt: skip
    assert (c["n_routed_experts"], c["num_experts_per_tok"], c["moe_latent_size"], c["routed_scaling_factor"]) == (
        8, 4, 24, 5.0
    )  # fmt: skip
    assert (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (32, 32, 2, 4)
    assert (shrunk.spec.mtp_layers, shrunk.spec.mtp_style) == (1, "nemotron")
    assert "MTP: 1 block(s) of pattern '*E' kept as published, written as mtp.layers.{d * 2 + i}.* (Nemotron-3 " \
        "Super's names)" in shrunk.notes  # fmt: skip
    assert "hybrid_override_pattern 88 layers (M x40, * x8, E x40) -> 'EM*E': the shortest stretch of the " \
        "published pattern holding every layer kind" in shrunk.notes  # fmt: skip


def test_an_mtp_pattern_the_decoder_lacks_is_refused_in_one_line(tmp_path: Path) -> None:
    published = json.loads((DATA / "nemotron-3-super-120b-a12b.config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**published, "mtp_hybrid_override_pattern": "*-"}))
    with pytest.raises(BadInput, match=r"^the MTP pattern '\*-' holds layer kinds the decoder pattern lacks \(-\)$"):
        shrink_file(path)


def test_a_megatron_core_assert_that_transformer_engine_is_required_is_an_environment_limit() -> None:
    """megatron-core 0.19.2's latent-MoE assert (moe_layer.py:266) is what this host lacks, not a bridge bug: verify
    exits 2 naming it (the published Super config shrunk, docs/families.md), never a build-failed finding."""
    missing = AssertionError("TransformerEngine is required for MoE latent projections.")
    assert _environment_limit(missing, "cpu", "te") == "without Transformer Engine"
    assert _environment_limit(missing, "cpu", "local") == "without Transformer Engine"
    assert _environment_limit(AssertionError("MTP pattern specified but mtp_block_spec is None"), "cpu") is None


def test_the_mtp_pattern_export_bug_explains_the_two_releases_messages_only() -> None:
    """`nemotronh-mtp-pattern-export-raises`: the config oracle's finding on 0.4.x (transformers' KeyError on '/')
    and on 0.5.x (the bridge's own ValueError) as recorded by the release smoke; not on 0.6.x, which splits the
    pattern, and not for another failure of the same export."""
    from convcheck.models.nemotron_h import MTP_PATTERN_EXPORT_RAISES as bug

    finding = ("config", "<megatron_to_hf_config>", "roundtrip-failed")
    assert bug.explains("0.4.2", *finding, "raised KeyError: '/'")
    rejected = "raised ValueError: Unknown layer type characters in hybrid_override_pattern: {'/'}. Expected: M"
    assert bug.explains("0.5.1", *finding, rejected)
    assert not bug.explains("0.6.2", *finding, "raised KeyError: '/'")
    assert not bug.explains("0.5.1", *finding, "raised KeyError: 'mamba_head_dim'")
