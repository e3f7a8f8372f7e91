"""Gemma 3 VL: the fixture keeps the published structure, the explicit mappings cover every parameter once (the Gemma 3
decoder under language_model, the SigLIP tower, the projector), values planted wrong in the real checkpoint's tensors
are named by tensor and first wrong element, and the real bridge's provider satisfies the config table (a planted
provider field is named), all without ranks. Two rank runs: the family's gate case (tiny:gemma3-vl at TP2 on the
bridge's TE specs) asserts its whole verdict (every oracle passes but the named bridge bugs), and one TP1 run with the
two bugs that touch the forward fixed (the projector's geometry, the post norms' epsilon) shows both logits passes,
text-only and on the image (bidirectional attention over the soft tokens included), agree with HF's to fp32 rounding.
The catalog's Gemma 3 VL mutants (convcheck.mutants.catalog_gemma3_vl) share the gate case as their clean run
(tests/test_catalog_kills.py); the other layouts' verdicts are recorded in docs/families.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from convcheck.compare.bits import bytes_equal, compare_bits
from convcheck.fixtures.reference import load_layout
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mappings import RankCoord
from convcheck.mappings.transposed import TransposedSplit
from convcheck.models import TABLES
from convcheck.models.config_rules import IGNORED, Coverage
from convcheck.models.gemma3_vl import TINY_GEMMA3_VL
from convcheck.models.mapping_registry import build_registry
from convcheck.oracles.config import check_rule, flatten, uncovered
from tests.support.helpers import matrix_run
from tests.test_verify_matrix import assert_matches_golden

ARCH = "Gemma3ForConditionalGeneration"
TOWER_LAYER = [f"{m}.{k}" for m in ("layer_norm1", "layer_norm2", "self_attn.q_proj", "self_attn.k_proj",
               "self_attn.v_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2") for k in ("weight", "bias")]  # fmt: skip
DECODER_LAYER = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.layer_norm_weight",
                 "self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight",
                 "self_attention.linear_proj.weight", "self_attention.linear_proj.post_layernorm.weight",
                 "mlp.linear_fc1.weight", "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc2.weight",
                 "mlp.linear_fc2.post_layernorm.weight")  # fmt: skip


def megatron_names() -> list[str]:
    """The bridge's Gemma3VLModel parameters on the TE spec (tied: no output layer at PP1): 6 decoder layers, a 2-layer
    SigLIP tower, the projector."""
    lm = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight"]
    lm += [f"decoder.layers.{i}.{p}" for i in range(6) for p in DECODER_LAYER]
    tower = ["embeddings.patch_embedding.weight", "embeddings.patch_embedding.bias",
             "embeddings.position_embedding.weight", "post_layernorm.weight", "post_layernorm.bias"]  # fmt: skip
    tower += [f"encoder.layers.{i}.{p}" for i in range(2) for p in TOWER_LAYER]
    projector = ["multi_modal_projector.mm_soft_embed_norm.weight", "multi_modal_projector.proj.weight"]
    return [f"language_model.{n}" for n in lm] + [f"vision_tower.{n}" for n in tower] + projector


def _checkpoint() -> Any:
    from convcheck.fixtures.build import build_fixture
    from convcheck.hf.checkpoint import open_checkpoint

    return open_checkpoint(build_fixture("tiny:gemma3-vl"))


def _tensors(checkpoint: Any) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for shard in sorted(checkpoint.path.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def _registry(checkpoint: Any) -> Any:
    return build_registry(ARCH, Geometry.from_hf_config(checkpoint.config), megatron_names(), checkpoint.tensors,
                          tied=True)  # fmt: skip


def test_the_fixture_keeps_the_published_structure() -> None:
    """gemma-3-4b-it's structure: the 5:1 sliding / global pattern with dual RoPE (linear 8 on the global one), sandwich
    norms, tied embeddings (no lm_head stored), a SigLIP tower without pooling head named `vision_tower.vision_model.*`,
    the projector's [V, H] weight and soft-embedding norm, soft tokens a square number pooling the patch grid, the image
    token inside the vocabulary, a Gemma 3 image processor and several shards."""
    from convcheck.fixtures.build import build_fixture

    layout = load_layout(TINY_GEMMA3_VL)
    config = json.loads(layout["config"])
    text, vision = config["text_config"], config["vision_config"]
    assert config["architectures"] == [ARCH] and config["model_type"] == "gemma3" and config["tie_word_embeddings"]
    assert text["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"] and text["sliding_window"] == 8
    assert text["rope_parameters"]["full_attention"] == {"factor": 8.0, "rope_theta": 1000000.0, "rope_type": "linear"}
    assert text["query_pre_attn_scalar"] != text["head_dim"]
    assert vision["vision_use_head"] is False and vision["model_type"] == "siglip_vision_model"
    side = vision["image_size"] // vision["patch_size"]
    pooled = math.isqrt(config["mm_tokens_per_image"])
    assert pooled**2 == config["mm_tokens_per_image"] and side % pooled == 0 and side // pooled == 2
    assert config["image_token_index"] < text["vocab_size"]
    assert len({config[k] for k in ("boi_token_index", "eoi_token_index", "image_token_index")}) == 3
    assert len({t["file"] for t in layout["tensors"]}) > 5
    checkpoint = _checkpoint()
    names = set(checkpoint.tensors)
    assert "language_model.lm_head.weight" not in names and not any(".head." in n for n in names)
    assert "vision_tower.vision_model.encoder.layers.1.mlp.fc2.weight" in names
    assert not any(n.startswith("vision_tower.encoder") for n in names)
    assert checkpoint.tensors["multi_modal_projector.mm_input_projection_weight"].shape == (16, 32)  # [V, H]
    processor = json.loads((build_fixture("tiny:gemma3-vl") / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == "Gemma3ImageProcessor"
    assert processor["size"] == {"height": 16, "width": 16}
    tokenizer = json.loads((build_fixture("tiny:gemma3-vl") / "tokenizer_config.json").read_text())
    assert tokenizer["extra_special_tokens"] == {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                                 "image_token": "<image_soft_token>"}  # fmt: skip
    vocab = json.loads((build_fixture("tiny:gemma3-vl") / "tokenizer.json").read_text())["model"]["vocab"]
    assert [vocab[t] for t in ("<start_of_image>", "<end_of_image>", "<image_soft_token>")] == [148, 149, 150]


def test_registry_covers_the_fixture_exactly_once() -> None:
    """Every Megatron parameter mapped once, every HF tensor produced once: the decoder in the VL spelling, the tower
    in the published namespace, the projector's weight transposed and split."""
    checkpoint = _checkpoint()
    registry = _registry(checkpoint)
    assert len(megatron_names()) == 101 and set(registry.mappings) == set(megatron_names()) and not registry.problems
    qkv = registry.get("language_model.decoder.layers.5.self_attention.linear_qkv.weight")
    assert qkv.hf_names == tuple(f"language_model.model.layers.5.self_attn.{p}_proj.weight" for p in "qkv")
    assert registry.get("language_model.decoder.layers.0.mlp.linear_fc2.post_layernorm.weight").hf == (
        "language_model.model.layers.0.post_feedforward_layernorm.weight"
    )
    assert registry.get("vision_tower.encoder.layers.0.self_attn.out_proj.bias").hf == (
        "vision_tower.vision_model.encoder.layers.0.self_attn.out_proj.bias"
    )
    assert isinstance(registry.get("multi_modal_projector.proj.weight"), TransposedSplit)


def test_the_tower_rule_follows_the_checkpoints_namespace() -> None:
    """A checkpoint as transformers 5.12.1 saves it (`vision_tower.*`) maps the tower there, as the bridge does."""
    checkpoint = _checkpoint()
    flat = {n.replace("vision_tower.vision_model.", "vision_tower."): s for n, s in checkpoint.tensors.items()}
    registry = build_registry(ARCH, Geometry.from_hf_config(checkpoint.config), megatron_names(), flat, tied=True)
    assert not registry.problems
    assert registry.get("vision_tower.post_layernorm.weight").hf == "vision_tower.post_layernorm.weight"


def test_the_transposed_split_shards_the_columns_and_names_a_planted_element() -> None:
    """`[V, H]` = [16, 32] at TP2: rank 1 holds HF columns 16-31 as rows; one element planted at HF [3, 20] is rank 1's
    row 4, column 3, and the rebuild from both shards is the HF tensor again, bitwise."""
    hf_name = "multi_modal_projector.mm_input_projection_weight"
    mapping = TransposedSplit(megatron="multi_modal_projector.proj.weight", hf=hf_name)
    clean = {hf_name: torch.arange(16 * 32, dtype=torch.float32).reshape(16, 32).to(torch.bfloat16)}
    layout = ParallelLayout(tp=2)
    shards = {RankCoord(tp_rank=r): mapping.to_shard(clean, layout, RankCoord(tp_rank=r)) for r in range(2)}
    assert shards[RankCoord(tp_rank=1)].shape == (16, 16)
    assert bytes_equal(shards[RankCoord(tp_rank=1)], clean[hf_name][:, 16:].t())
    ((name, rebuilt),) = mapping.from_shards(shards, layout)
    assert name == hf_name and bytes_equal(rebuilt, clean[hf_name])
    planted = {hf_name: clean[hf_name].clone()}
    planted[hf_name][3, 20] = -1.0
    found = compare_bits(mapping.megatron, shards[RankCoord(tp_rank=1)],
                         mapping.to_shard(planted, layout, RankCoord(tp_rank=1)))  # fmt: skip
    assert found is not None and found.detail["first_index"] == [4, 3] and found.detail["count"] == 1


@pytest.mark.parametrize(
    ("megatron", "hf", "where", "first"),
    [
        # the projector: HF [V=16, H=32] column 21 is rank 1's row 5
        ("multi_modal_projector.proj.weight", "multi_modal_projector.mm_input_projection_weight", (7, 21), [5, 7]),
        # q_proj rows of KV group 1 (heads 2-3) are rank 1's first rows: HF row 17 (head 2, channel 1) is row 1
        ("language_model.decoder.layers.5.self_attention.linear_qkv.weight",
         "language_model.model.layers.5.self_attn.q_proj.weight", (17, 4), [1, 4]),
        # the tower's position embedding [16 patches, 16] is whole on every rank
        ("vision_tower.embeddings.position_embedding.weight",
         "vision_tower.vision_model.embeddings.position_embedding.weight", (9, 2), [9, 2]),
    ],
)  # fmt: skip
def test_a_value_planted_in_the_checkpoint_is_named_at_its_first_wrong_element(
    megatron: str, hf: str, where: tuple[int, int], first: list[int]
) -> None:
    """One element of a real tiny:gemma3-vl tensor changed: rank 1's TP2 shard differs from the clean one at exactly
    the element the mapping puts it."""
    checkpoint = _checkpoint()
    tensors = _tensors(checkpoint)
    registry = _registry(checkpoint)
    layout, coord = ParallelLayout(tp=2), RankCoord(tp_rank=1)
    planted = dict(tensors)
    planted[hf] = tensors[hf].clone()
    planted[hf][where] = -planted[hf][where]
    mapping = registry.get(megatron)
    found = compare_bits(megatron, mapping.to_shard(tensors, layout, coord), mapping.to_shard(planted, layout, coord))
    assert found is not None and found.tensor == megatron and found.kind == "bytes-differ"
    assert found.detail["first_index"] == first and found.detail["count"] == 1


# ---- the config table, without ranks ---------------------------------------------------------------------------------


def _provider() -> tuple[Any, Any, dict[str, Any]]:
    """(HF config, the real Gemma3VLBridge's provider, the flattened HF view) for tiny:gemma3-vl."""
    import transformers

    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge import AutoBridge

    hf = transformers.Gemma3Config(**TINY_GEMMA3_VL.config)
    hf.architectures = [ARCH]
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    cls = transformers.Gemma3Config
    return hf, provider, {**flatten(cls().to_dict()), **flatten(hf.to_dict())}


def _failing(provider: Any, view: dict[str, Any]) -> dict[str, Any]:
    """Label -> finding of every provider-side rule (the `model.*` rules need a built model) that fails."""

    def get(field: str) -> Any:
        if not hasattr(provider, field):
            raise AttributeError(field)
        return getattr(provider, field)

    rules = [r for r in TABLES["gemma3"] if not r.megatron.startswith("model.")]
    return {f.tensor: f for f in (check_rule(r, view, get) for r in rules) if f is not None}


def test_every_field_is_named_and_the_real_provider_satisfies_every_rule() -> None:
    import transformers

    cls = transformers.Gemma3Config
    rules = TABLES["gemma3"]
    named = {f for rule in rules for f in (*rule.hf, *rule.also)}
    covered = {".".join(n.split(".")[:2]) if n.startswith(("text_config.", "vision_config.")) else n for n in named}
    text = {f"text_config.{f}" for f in cls.sub_configs["text_config"].__annotations__}
    vision = {f"vision_config.{f}" for f in cls.sub_configs["vision_config"].__annotations__}
    top = {f for f in cls.__annotations__ if f not in ("text_config", "vision_config")}
    skipped = {f"{sub}.{f}" for sub in ("text_config", "vision_config") for f in IGNORED}
    assert sorted((text | vision | top) - covered - skipped - set(IGNORED)) == []
    source, defaults = flatten(cls(**TINY_GEMMA3_VL.config).to_dict()), flatten(cls().to_dict())
    assert uncovered(source, defaults, Coverage(rules=rules)) == []
    _, provider, view = _provider()
    assert _failing(provider, view) == {}


def test_planted_provider_fields_are_named() -> None:
    """Planted on the real Gemma3VLBridge provider: the global base as the local one, a head_dim-scaled softmax and the
    window off by one are each named by their rule."""
    _, provider, view = _provider()
    provider.rotary_base = (10000.0, 10000.0)
    provider.softmax_scale = 1.0 / math.sqrt(8)
    provider.window_size = 7
    found = _failing(provider, view)
    assert sorted(found) == [
        "text_config.query_pre_attn_scalar -> softmax_scale",
        "text_config.rope_parameters -> rotary_base",
        "text_config.sliding_window -> window_size",
    ]
    assert found["text_config.rope_parameters -> rotary_base"].detail["expected"] == "[10000.0, 1000000.0]"


def test_the_head_rule_sees_the_pooling_head_in_either_tower_a_release_builds() -> None:
    """Bridge releases before 0.5.0 hold transformers' whole SiglipVisionModel as the tower, which in transformers 5.3
    wraps the head-holding module under `vision_model`; later ones hold the head-holding module itself. The head rule
    observes the head, and its absence, in both shapes (before, the wrapped tower read as headless: a false mismatch
    on bridge 0.4.0). The wrapped shape here is transformers' own SiglipModel, whose `vision_model` holds the head."""
    import transformers

    from convcheck.models.gemma3_vl_config import VISION_TOWER

    (rule,) = [r for r in VISION_TOWER if r.megatron == "model.vision_tower"]
    tiny = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    for use_head in (True, False):
        vision = {**tiny, "image_size": 16, "patch_size": 4, "vision_use_head": use_head}
        inner = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision))
        wrapped = transformers.SiglipModel(transformers.SiglipConfig(text_config=tiny, vision_config=vision))
        assert hasattr(wrapped.vision_model, "head") is use_head and not hasattr(wrapped, "head")
        assert [rule.observe(t, None) for t in (inner, wrapped)] == [use_head, use_head]


# ---- rank runs -------------------------------------------------------------------------------------------------------

ORACLES = ("coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping")
EPS, GEOMETRY, EXPORT = (
    "te-post-layernorm-default-eps",
    "gemma3-vl-projector-geometry-fixed",
    "gemma3-vl-config-export-flat",
)


@pytest.mark.ranks
def test_gemma3_vl_tp2_passes_but_the_named_bugs(shared_root: Any) -> None:
    """TP2 (the projector's ColumnParallelLinear and the decoder split, the tower whole on each rank): import, export,
    layout and every mapping exact; the config names the projector's fixed geometry and the flat config export; the
    text logits differ by the post norms' epsilon only (greedy tokens equal) and the image pass stops at the projector's
    64x64 reshape on both ranks."""
    layout = ("--tp", "2", "--spec", "te", "--experts", "auto")
    res, folder = matrix_run(shared_root, "gemma3-vl", layout)
    assert_matches_golden("gemma3-vl", layout, folder / "manifest.json")
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {**dict.fromkeys(ORACLES, "pass"), "config": "fail", "logits": "fail"}
    config = {(f["tensor"], f["kind"], f["detail"].get("upstream_bug")) for f in res.findings("config")}
    assert {bug for *_, bug in config} == {GEOMETRY, EXPORT}
    assert {(t, k) for t, k, bug in config if bug == GEOMETRY} == {
        ("mm_tokens_per_image -> model.multi_modal_projector.avg_pool.kernel_size", "mismatch"),
        (
            "vision_config.image_size+vision_config.patch_size -> model.multi_modal_projector.patches_per_side",
            "mismatch",
        ),
    }
    logits = [(f["tensor"], f["kind"], f["detail"].get("upstream_bug")) for f in res.findings("logits")]
    assert sorted(logits) == [("<megatron forward>[image]", "forward-failed", GEOMETRY)] * 2 + [
        ("logits", "logits-differ", EPS)
    ]
    assert all("shape '[1, 16, 64, 64]' is invalid" in f["message"] for f in res.findings("logits")[:2])
    metrics = {o["name"]: o for o in res.report["oracles"]}["logits"]["metrics"]
    assert 1e-5 < metrics["max_abs_err"] < 1e-3 and metrics["greedy_match"] == "32/32"
    mapping = {o["name"]: o for o in res.report["oracles"]}["mapping"]
    assert sum(1 for t in mapping["tensors"] if t["verdict"] == "pass") == len(mapping["tensors"]) == 101


@pytest.mark.ranks
def test_with_the_forward_bugs_fixed_text_and_image_logits_agree_with_hf(tmp_path: Path) -> None:
    """TP1 with the projector's geometry read from the HF config and the post norms built with the model's epsilon
    (tests/support/hooks_gemma3_vl.py:both_fixed): text-only and image logits (SigLIP tower, 2x2 pooling, soft-token
    norm, projection, the soft tokens attending to each other bidirectionally as HF's token_type_ids mask does) agree
    with HF's to fp32 rounding, and the config names only the flat export."""
    from tests.support.helpers import run_cli

    hook = "tests.support.hooks_gemma3_vl:both_fixed"
    res = run_cli("verify", "--model", "tiny:gemma3-vl", "--oracle", "logits,config", "--hook", hook,
                  "--table", "none", tmp_path=tmp_path, timeout=400)  # fmt: skip
    assert res.code == 1 and res.report is not None, res.err[-2000:]
    assert res.verdicts() == {"logits": "pass", "config": "fail"}
    assert {f["detail"].get("upstream_bug") for f in res.findings("config")} == {EXPORT}
    metrics = {o["name"]: o for o in res.report["oracles"]}["logits"]["metrics"]
    assert metrics["max_abs_err"] < 1e-5 and metrics["greedy_match"] == "32/32"
    assert metrics["image_max_abs_err"] < 1e-5 and metrics["image_greedy_match"] == "16/16"
    assert metrics["image_input"] == "1x16 ids, image 3x16x16, 4 image tokens"


def test_the_pooling_head_bug_names_the_published_head_names_and_the_head_rule() -> None:
    """Recorded on the published config without vision_use_head (bench/results/cpu-gemma3-vl-2026-12-07.json): the
    head's tensors under either tower namespace, the mapping oracle's uncovered HF tensors and the config table's head
    rule are the bridge bug; a tower tensor that is not the head's is not."""
    from convcheck.models import BY_HF_CLASS
    from convcheck.models.registered_bugs import GEMMA3_VL_POOLING_HEAD_DROPPED as BUG

    assert BUG in BY_HF_CLASS[ARCH].upstream_bugs
    for name in ("vision_tower.vision_model.head.probe", "vision_tower.head.mlp.fc1.weight"):
        assert BUG.explains("0.6.2", "roundtrip", name, "missing") and BUG.explains(
            "0.6.2", "mapping", name, "uncovered"
        )
    assert BUG.explains("0.6.2", "config", "vision_config.vision_use_head -> model.vision_tower", "mismatch")
    assert not BUG.explains("0.6.2", "roundtrip", "vision_tower.vision_model.post_layernorm.weight", "missing")


@pytest.mark.ranks
def test_the_image_pass_names_soft_tokens_that_attend_causally(tmp_path: Path) -> None:
    """With both forward bugs fixed and the bridge's attention bias planted causal for the soft tokens (HF's
    token_type_ids mask lets them see their whole image): the text pass still agrees; the image logits are named, their
    worst at the first soft token (position 3, after two text tokens and start-of-image), which sees only itself; the
    image's greedy tokens change too."""
    from tests.support.helpers import run_cli

    hook = "tests.support.hooks_gemma3_vl:both_fixed_image_mask_causal"
    res = run_cli("verify", "--model", "tiny:gemma3-vl", "--oracle", "logits", "--hook", hook, "--table", "none",
                  tmp_path=tmp_path, timeout=400)  # fmt: skip
    assert res.code == 1 and res.report is not None, res.err[-2000:]
    (logits,) = res.report["oracles"]
    found = {f["tensor"]: f["message"] for f in logits["findings"]}
    assert sorted(found) == ["greedy-tokens[image]", "logits[image]"]
    assert "worst at [batch 0, position 3, " in found["logits[image]"]  # the first soft token sees only itself
    assert logits["metrics"]["max_abs_err"] < 1e-5 and logits["metrics"]["greedy_match"] == "32/32"
    assert logits["metrics"]["image_max_abs_err"] > 1e-2


def test_the_streamed_hf_reference_builds_the_text_model_in_fp32() -> None:
    """The logits oracle's streamed HF model of a VL checkpoint whose text_config says bfloat16 (as transformers writes
    it) builds every sub-model in fp32, as from_pretrained(dtype=float32) does: Gemma 3's embedding scale is sqrt(H) in
    fp32, not its bf16 rounding (5.65625 for sqrt(32), which moved every text logit by 2.3e-4 relative)."""
    from convcheck.fixtures.build import build_fixture
    from convcheck.oracles.hf_stream import meta_model

    model = meta_model(str(build_fixture("tiny:gemma3-vl")))
    scale = model.model.language_model.embed_tokens.embed_scale
    assert scale.dtype == torch.float32 and float(scale) == float(torch.tensor(32.0).sqrt())
