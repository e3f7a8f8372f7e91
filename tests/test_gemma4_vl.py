"""Gemma 4 VL (Gemma4ForConditionalGeneration): the fixture keeps E4B's published structure (vision tower with clipped
linears whose bounds clip, its embedder, the audio tower), the explicit mappings cover every parameter and buffer
once (the Gemma 4 text decoder under language_model, the towers whole) and a value planted in the real checkpoint is
named at its first wrong element, the config table names every field and the real bridge's provider satisfies it (a
planted tower field is named), the image pass's inputs follow transformers' Gemma4ImageProcessor, and the named bridge
bug is still upstream, all without ranks; one rank run, the family's gate case (TP2), asserts its whole verdict. The
other layouts' verdicts are recorded in bench/results/cpu-gemma4-vl-2026-12-07.json and docs/families.md.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from convcheck.compare.bits import compare_bits
from convcheck.fixtures.reference import load_layout
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout, RankCoord
from convcheck.mappings import Replicated
from convcheck.models import TABLES, UPSTREAM_BUG, tag_upstream_bugs
from convcheck.models.config_rules import Coverage
from convcheck.models.gemma4_vl import TINY_GEMMA4_VL, TINY_GEMMA4_VL_MOE
from convcheck.models.mapping_registry import build_registry
from convcheck.oracles.config import check_rule, flatten, uncovered
from convcheck.verdict import Finding, OracleVerdict
from tests.support.helpers import matrix_run
from tests.test_gemma4 import LAYER, MODEL
from tests.test_verify_matrix import assert_matches_golden

NAME = "gemma4-vl"


def _checkpoint() -> Any:
    from convcheck.fixtures.build import build_fixture
    from convcheck.hf.checkpoint import open_checkpoint

    return open_checkpoint(build_fixture(f"tiny:{NAME}"))


def _tensors(checkpoint: Any) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for shard in sorted(checkpoint.path.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def _megatron_names(hf_names: list[str]) -> list[str]:
    """The Megatron parameters and persistent buffers of Gemma4VLModel on tiny:gemma4-vl: the dense decoder's under
    language_model, every tower tensor under the HF name without `model.` (what ReplicatedMapping `vision_tower.**`
    pairs)."""
    lm = [*MODEL, *(f"decoder.layers.{i}.{p}" for i in range(6) for p in LAYER)]
    modules = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")
    towers = [n[len("model.") :] for n in hf_names if n.startswith(modules)]
    return [f"language_model.{n}" for n in lm] + towers


def test_the_fixture_keeps_e4b_structure_and_its_clip_bounds_clip() -> None:
    layout = load_layout(TINY_GEMMA4_VL)
    config = json.loads(layout["config"])
    names = {t["name"]: t["shape"] for t in layout["tensors"]}
    text, vision = config["text_config"], config["vision_config"]
    assert config["architectures"] == ["Gemma4ForConditionalGeneration"] and config["tie_word_embeddings"] is True
    assert text["num_kv_shared_layers"] == 2 and text["hidden_size_per_layer_input"] == 4
    assert text["num_global_key_value_heads"] is None and text["attention_k_eq_v"] is False  # as E4B publishes
    assert vision["use_clipped_linears"] is True and vision["pooling_kernel_size"] == 3
    assert names["model.vision_tower.patch_embedder.position_embedding_table"] == [2, 16, 16]
    assert names["model.embed_vision.embedding_projection.weight"] == [32, 16]
    assert (
        names["model.audio_tower.output_proj.bias"] == [16] and "model.embed_audio.embedding_projection.weight" in names
    )
    assert "model.language_model.layers.4.self_attn.k_proj.weight" not in names  # KV-shared
    assert len({t["file"] for t in layout["tensors"]}) > 3
    tensors = _tensors(_checkpoint())
    bounds = {n: float(t) for n, t in tensors.items() if n.endswith(("_min", "_max"))}
    assert len(bounds) == 4 * (7 * 2 + 10)  # 7 clipped linears per vision block x2, 10 in the audio layer
    assert all(v < -0.49 if n.endswith("_min") else v > 0.49 for n, v in bounds.items())


def test_registry_covers_every_parameter_and_buffer_once_and_a_planted_value_is_named() -> None:
    checkpoint = _checkpoint()
    hf = sorted(checkpoint.tensors)
    meg = _megatron_names(hf)
    registry = build_registry("Gemma4ForConditionalGeneration", Geometry.from_hf_config(checkpoint.config), meg, hf,
                              tied=True, strict=False)  # fmt: skip
    assert registry.problems == tuple(
        f"language_model.decoder.layers.{i}.self_attention.k_layernorm.weight: Megatron parameter has no mapping"
        for i in (4, 5)
    )  # gemma4-shared-kv-k-norm-unmapped, as in the text family
    bound = registry.get("vision_tower.encoder.layers.1.self_attn.q_proj.input_max")
    assert (
        isinstance(bound, Replicated) and bound.hf == "model.vision_tower.encoder.layers.1.self_attn.q_proj.input_max"
    )
    qkv = registry.get("language_model.decoder.layers.2.self_attention.linear_qkv.weight")
    assert qkv.q == "model.language_model.layers.2.self_attn.q_proj.weight" and qkv.head_dim == 16
    assert (
        registry.get("language_model.per_layer_embedding.weight").hf
        == "model.language_model.embed_tokens_per_layer.weight"
    )
    tensors = _tensors(checkpoint)
    layout, coord = ParallelLayout(tp=2), RankCoord(tp_rank=1)
    for megatron, name, where, first in (
        ("vision_tower.patch_embedder.position_embedding_table",
         "model.vision_tower.patch_embedder.position_embedding_table", (1, 3, 5), [1, 3, 5]),  # y table, whole
        ("language_model.decoder.layers.0.self_attention.linear_qkv.weight",
         "model.language_model.layers.0.self_attn.k_proj.weight", (9, 4), [2 * 8 + 1, 4]),  # group 1: [q 2-3; k_1; v_1]
    ):  # fmt: skip
        planted = dict(tensors)
        planted[name] = tensors[name].clone()
        planted[name][where] = -planted[name][where]
        mapping = registry.get(megatron)
        finding = compare_bits(
            megatron, mapping.to_shard(tensors, layout, coord), mapping.to_shard(planted, layout, coord)
        )
        assert finding is not None and finding.tensor == megatron
        assert finding.detail["first_index"] == first and finding.detail["count"] == 1


def _provider() -> tuple[Any, dict[str, Any]]:
    import transformers

    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge import AutoBridge

    hf = transformers.Gemma4Config(**TINY_GEMMA4_VL.config)
    hf.architectures = ["Gemma4ForConditionalGeneration"]
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    return provider, {**flatten(transformers.Gemma4Config().to_dict()), **flatten(hf.to_dict())}


def _get(provider: Any) -> Any:
    def get(field: str) -> Any:
        owner: Any = provider
        for part in field.removeprefix("model.config.").split("."):
            if not hasattr(owner, part):
                raise AttributeError(field)
            owner = getattr(owner, part)
        return owner

    return get


def test_every_field_is_named_and_the_real_provider_satisfies_every_rule_and_a_planted_field_is_named() -> None:
    provider, view = _provider()
    rules = [r for r in TABLES["gemma4"] if not r.megatron.startswith("model.language_model.")]
    active = [r for r in rules if r.when is None or r.when(view)]
    import transformers

    source = flatten(transformers.Gemma4Config.from_dict(json.loads(load_layout(TINY_GEMMA4_VL)["config"])).to_dict())
    defaults = flatten(transformers.Gemma4Config().to_dict())
    assert uncovered(source, defaults, Coverage(rules=TABLES["gemma4"])) == []
    assert [f for f in (check_rule(r, view, _get(provider)) for r in active) if f is not None] == []
    provider.vision_config.pooling_kernel_size = 2
    provider.image_token_id = 5
    failing = {f.tensor for f in (check_rule(r, view, _get(provider)) for r in active) if f is not None}
    assert failing == {"vision_config.pooling_kernel_size -> model.config.vision_config.pooling_kernel_size",
                       "image_token_id -> image_token_id"}  # fmt: skip


def test_the_image_inputs_follow_the_gemma4_processor_arithmetic() -> None:
    """Patches in row-major order, each [py, px, c] flattened (image_processing_gemma4.py convert_image_to_patches),
    positions (x, y), one `<|image|>` per pooled 3x3 window between `<|image>` and `<image|>`."""
    from convcheck.oracles.image_input import GEMMA4_SIDE, gemma4_image_inputs

    checkpoint = _checkpoint()
    inputs = gemma4_image_inputs(checkpoint.path, checkpoint.config)
    assert inputs is not None
    pixels, positions, ids = inputs["pixel_values"], inputs["image_position_ids"], inputs["input_ids"][0].tolist()
    assert pixels.shape == (1, 36, 48) and positions[0, 7].tolist() == [1, 1] and positions[0, 6].tolist() == [0, 1]
    assert ids[2:8] == [121, 123, 123, 123, 123, 125] and int(inputs["mm_token_type_ids"].sum()) == 4
    assert 0.0 <= float(pixels.min()) and float(pixels.max()) <= 1.0 and GEMMA4_SIDE == 24


def test_the_null_global_kv_heads_bug_is_tagged_and_still_upstream() -> None:
    message = "bridge.load_hf_weights raised TypeError: unsupported operand type(s) for *: 'NoneType' and 'int'"
    crash = Finding(tensor="<import>", kind="import-failed", message=message)
    tagged, lines = tag_upstream_bugs("Gemma4ForConditionalGeneration", "0.6.2",
                                      [OracleVerdict(name="coverage", checked=1, findings=(crash,))])  # fmt: skip
    assert tagged[0].findings[0].detail[UPSTREAM_BUG] == "gemma4-shared-kv-null-global-kv-heads" and len(lines) == 1
    other = Finding(tensor="<import>", kind="import-failed", message="bridge.load_hf_weights raised KeyError: 'x'")
    untagged, _ = tag_upstream_bugs("Gemma4ForConditionalGeneration", "0.6.2",
                                    [OracleVerdict(name="coverage", checked=1, findings=(other,))])  # fmt: skip
    assert UPSTREAM_BUG not in untagged[0].findings[0].detail
    gemma = Path(importlib.util.find_spec("megatron.bridge").origin).parent / "models" / "gemma"  # type: ignore[arg-type]
    bridge = (gemma / "gemma4_bridge.py").read_text().splitlines()
    assert '"num_global_key_value_heads",' in bridge[413] and "kv_shape = (num_kv_heads * kv_head_dim" in bridge[418]
    assert torch.tensor(0).dtype == torch.int64


def test_the_published_e4b_config_is_shrunk_whole_and_builds() -> None:
    """The published E4B config.json (tests/data) shrinks with its towers: the text rules' period, KV sharing and
    per-layer inputs, the published null global KV heads, the vision tower's pooling and clipped linears, the audio
    tower, the multimodal ids at the vocabulary's end in their order; what changed is said; the fixture builds."""
    from convcheck.errors import BadInput
    from convcheck.fixtures.from_config import build_from_config, shrink_file

    path = Path(__file__).parent / "data" / "gemma-4-e4b.config.json"
    shrunk = shrink_file(path)
    config = shrunk.spec.config
    text, vision, audio = config["text_config"], config["vision_config"], config["audio_config"]
    assert shrunk.spec.config_class == "Gemma4Config" and shrunk.spec.clip_bounds
    assert text["num_hidden_layers"] == 12 and text["num_kv_shared_layers"] == 5 and text["vocab_size"] == 128
    assert text["num_global_key_value_heads"] is None and text["hidden_size_per_layer_input"] > 0
    assert (vision["pooling_kernel_size"], vision["use_clipped_linears"], vision["standardize"]) == (3, True, False)
    assert (vision["hidden_size"], vision["patch_size"], vision["num_hidden_layers"]) == (16, 4, 2)
    assert audio["use_clipped_linears"] is True and audio["output_proj_dims"] == 16
    ids = [config[k] for k in ("boi_token_id", "boa_token_id", "image_token_id", "audio_token_id", "eoi_token_id",
                               "eoa_token_id", "video_token_id")]  # fmt: skip
    assert ids == [121, 122, 123, 124, 125, 126, 127] and config["eos_token_id"] == 106
    assert "image_token_id 258880 -> 123 (the shrunk vocabulary's last ids)" in shrunk.notes
    assert "vision_config.patch_size 16 -> 4" in shrunk.notes
    folder, _ = build_from_config(path)
    built = json.loads((folder / "config.json").read_text())
    assert built["architectures"] == ["Gemma4ForConditionalGeneration"]
    assert built["vision_config"]["use_clipped_linears"] is True and (folder / "preprocessor_config.json").is_file()
    published = json.loads(path.read_text())
    try:
        shrink_file_of({**published, "vision_config": None})
    except BadInput as exc:
        assert str(exc) == "a gemma4 config.json needs a vision_config object"
    else:
        raise AssertionError("a gemma4 config without a vision tower was shrunk")


def shrink_file_of(config: dict[str, Any]) -> Any:
    """shrink_file on `config` written to a scratch file."""
    import tempfile

    from convcheck.fixtures.from_config import shrink_file

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "config.json"
        path.write_text(json.dumps(config))
        return shrink_file(path)


def test_the_bug_as_the_value_oracles_see_it_tags_never_loaded_nan_only() -> None:
    """A mapping-only run (a selftest launch) names layer 5's NaN shard: tagged; a finite wrong value (a planted bug)
    on the same tensor is not."""
    tensor = "language_model.decoder.layers.5.self_attention.linear_qkv.weight"
    nan = Finding(tensor=tensor, kind="import-bytes-differ", message="4096/4096 elements differ; first at index "
                  "[0, 0]: got nan (0x7fa5), expected -3.2e-05 (0xb809)")  # fmt: skip
    finite = Finding(tensor=tensor, kind="import-bytes-differ", message="1/4096 elements differ; first at index "
                     "[0, 0]: got 3.2e-05 (0x3809), expected -3.2e-05 (0xb809)")  # fmt: skip
    never = "2048/2048 elements never written (still the NaN sentinel), first at index [0, 0]"
    unsent = Finding(tensor="model.language_model.layers.5.self_attn.q_proj.weight", kind="not-written", message=never)
    tagged, lines = tag_upstream_bugs("Gemma4ForConditionalGeneration", "0.6.2", [
        OracleVerdict(name="mapping", checked=2, findings=(nan, finite)),
        OracleVerdict(name="receiver", checked=1, findings=(unsent,)),
    ])  # fmt: skip
    assert [f.detail.get(UPSTREAM_BUG) for v in tagged for f in v.findings] == [
        "gemma4-shared-kv-null-global-kv-heads", None, "gemma4-shared-kv-null-global-kv-heads"]  # fmt: skip
    assert len(lines) == 1 and lines[0].startswith("2 finding(s) are the known megatron-bridge bug gemma4-shared-kv")


ORACLES = ("coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping")
NULL_HEADS, K_NORM = "gemma4-shared-kv-null-global-kv-heads", "gemma4-shared-kv-k-norm-unmapped"


@pytest.mark.ranks
def test_gemma4_vl_tp2_fails_only_on_the_named_bugs(shared_root: Any) -> None:
    """TP2 (the gate case gemma4-vl/tp2+te): the import crashes at layer 5, KV-shared and full-attention
    (gemma4-shared-kv-null-global-kv-heads), leaving its q_proj / q_norm NaN, which roundtrip, layout, mapping and both
    logits passes name; the shared layers' k norms are unmapped (gemma4-shared-kv-k-norm-unmapped); the towers, every
    other decoder tensor, the config and the export streams are exact. The catalog's Gemma 4 VL mutants share this run
    as their clean run (tests/test_catalog_kills.py)."""
    layout = ("--tp", "2", "--spec", "te", "--experts", "auto")
    res, folder = matrix_run(shared_root, NAME, layout)
    assert_matches_golden(NAME, layout, folder / "manifest.json")
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {**dict.fromkeys(ORACLES, "fail"), "config": "pass", "differential": "pass",
                              "elements": "pass"}  # fmt: skip
    found = {(o, f["tensor"], f["kind"], f["detail"].get("upstream_bug"))
             for o in ORACLES for f in res.findings(o)}  # fmt: skip
    layer5, hf5 = "language_model.decoder.layers.5.self_attention.", "model.language_model.layers.5.self_attn."
    k_norms = {f"language_model.decoder.layers.{i}.self_attention.k_layernorm.weight" for i in (4, 5)}
    assert found == {
        ("coverage", "<import>", "import-failed", NULL_HEADS),
        *(("coverage", n, kind, K_NORM) for n in k_norms for kind in ("hf-missing", "not-loaded")),
        *(("coverage", layer5 + p, "not-loaded", NULL_HEADS) for p in ("linear_qkv.weight", "q_layernorm.weight")),
        *(("roundtrip", hf5 + p, "bytes-differ", NULL_HEADS) for p in ("q_norm.weight", "q_proj.weight")),
        *(("layout", hf5 + p, "tp1-differs-from-source", NULL_HEADS) for p in ("q_norm.weight", "q_proj.weight")),
        *(("logits", t, k, NULL_HEADS) for t in ("logits", "logits[image]") for k in ("logits-differ",)),
        *(("logits", t, "greedy-differs", NULL_HEADS) for t in ("greedy-tokens", "greedy-tokens[image]")),
        *(("mapping", n, "uncovered", K_NORM) for n in k_norms),
        *(
            ("mapping", layer5 + p, "import-bytes-differ", NULL_HEADS)
            for p in ("linear_qkv.weight", "q_layernorm.weight")
        ),
    }
    mapping = {o["name"]: o for o in res.report["oracles"]}["mapping"]
    towers = [
        t for t in mapping["tensors"] if t["tensor"].startswith(("vision_tower.", "embed_vision.", "audio_tower."))
    ]
    assert len(towers) > 150 and all(t["verdict"] == "pass" for t in towers)


def test_the_moe_vl_fixture_keeps_26b_a4b_structure_and_its_provider_satisfies_the_table() -> None:
    """tiny:gemma4-vl-moe: the MoE language model with bidirectional attention over images, standardised soft tokens,
    no audio tower; the real MoE VL provider satisfies every provider-side rule (use_bidirectional_attention read from
    its text_config, which the VL model builds its mask from)."""
    import transformers

    from convcheck import compat

    layout = load_layout(TINY_GEMMA4_VL_MOE)
    names = {t["name"]: t["shape"] for t in layout["tensors"]}
    config = json.loads(layout["config"])
    assert config["text_config"]["use_bidirectional_attention"] == "vision" and config["vision_config"]["standardize"]
    assert names["model.vision_tower.std_scale"] == [16] and not any("audio" in n for n in names)
    assert names["model.language_model.layers.0.experts.gate_up_proj"] == [8, 16, 32]
    compat.install_import_shims()
    from megatron.bridge import AutoBridge

    hf = transformers.Gemma4Config(**TINY_GEMMA4_VL_MOE.config)
    hf.architectures = ["Gemma4ForConditionalGeneration"]
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    view = {**flatten(transformers.Gemma4Config().to_dict()), **flatten(hf.to_dict())}
    rules = [r for r in TABLES["gemma4"] if not r.megatron.startswith("model.language_model.")]
    active = [r for r in rules if r.when is None or r.when(view)]
    assert [f for f in (check_rule(r, view, _get(provider)) for r in active) if f is not None] == []
    provider.text_config.use_bidirectional_attention = None
    failing = [f.tensor for f in (check_rule(r, view, _get(provider)) for r in active) if f is not None]
    assert failing == [
        "text_config.use_bidirectional_attention -> model.config.text_config.use_bidirectional_attention"
    ]


def test_the_bidirectional_image_bugs_tag_only_configs_that_ask_for_it() -> None:
    """gemma4-vl-image-attention-causal names the image pass's logits of a config with use_bidirectional_attention
    'vision' (the MoE VL), never the dense E4B's (causal, where a differing image pass is another bug); the MoE post
    norm bug is the MoE VL's only (read in text_config)."""
    image = OracleVerdict(name="logits", checked=1, findings=(
        Finding(tensor="logits[image]", kind="logits-differ", message="m"),
        Finding(tensor="logits", kind="logits-differ", message="m"),
    ))  # fmt: skip
    moe_config = json.loads(load_layout(TINY_GEMMA4_VL_MOE)["config"])
    dense_config = json.loads(load_layout(TINY_GEMMA4_VL)["config"])
    arch, version = "Gemma4ForConditionalGeneration", "0.6.2"
    moe, _ = tag_upstream_bugs(arch, version, [image], config=moe_config)
    dense, _ = tag_upstream_bugs(arch, version, [image], config=dense_config)
    assert [f.detail.get(UPSTREAM_BUG) for f in moe[0].findings] == [
        "gemma4-vl-image-attention-causal", "te-post-layernorm-default-eps"]  # fmt: skip
    assert [f.detail.get(UPSTREAM_BUG) for f in dense[0].findings] == [None, None]


def test_the_streamed_hf_reference_of_the_vl_wrapper_is_the_fp32_models_bitwise() -> None:
    """The logits oracle's streamed reference builds a wrapper's sub-configs in fp32: tiny:gemma4-vl-moe's text-only
    logits equal the model loaded whole in fp32 bit for bit (a bf16 text_config made embed_scale bf16: 3e-4)."""
    from convcheck.compare.bits import bytes_equal
    from convcheck.fixtures.build import build_fixture
    from convcheck.oracles.hf_stream import streamed_logits
    from convcheck.oracles.logits import fixed_tokens, hf_logits, placeholder_ids

    folder = build_fixture("tiny:gemma4-vl-moe")
    tokens = fixed_tokens(128, placeholder_ids(json.loads((folder / "config.json").read_text())))
    assert bytes_equal(streamed_logits(str(folder), tokens), hf_logits(folder, tokens))
