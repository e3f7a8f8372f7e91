"""Multi-latent attention mappings as pure functions (exact row placement, bitwise round trips at TP 1/2/4, shape and
layout refusals) and the DeepSeek-V3 registry over the tiny fixtures' real names, no ranks."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from convcheck.compare.bits import compare_bits
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.mappings import (
    CoverageError,
    Gated,
    HeadRows,
    MappingError,
    RankCoord,
    Replicated,
    Split,
    WithCopies,
)
from convcheck.mappings import roundtrip_findings as roundtrip
from convcheck.mappings.mla import kv_down, kv_up, q_down, q_up
from convcheck.models.mapping_registry import build_registry

HEADS, NOPE, ROPE, V, Q_LORA, KV_LORA, HIDDEN = 4, 6, 2, 5, 12, 10, 16


def rows(n: int, cols: int) -> torch.Tensor:
    """Row i holds i*1000 + j: a misplaced row shows which HF row it was."""
    return (torch.arange(n)[:, None] * 1000 + torch.arange(cols)[None, :]).float()


def mla() -> list[tuple[HeadRows, dict[str, torch.Tensor]]]:
    """Every MLA projection mapping with an HF weight of its shape."""
    cases = [
        (q_down(megatron="q_down", hf="q_a", q_lora_rank=Q_LORA, hidden=HIDDEN), rows(Q_LORA, HIDDEN)),
        (kv_down(megatron="kv_down", hf="kv_a", kv_lora_rank=KV_LORA, rope_dim=ROPE, hidden=HIDDEN),
         rows(KV_LORA + ROPE, HIDDEN)),
        (q_up(megatron="q_up", hf="q_b", heads=HEADS, nope_dim=NOPE, rope_dim=ROPE, cols=Q_LORA),
         rows(HEADS * (NOPE + ROPE), Q_LORA)),
        (q_up(megatron="q_proj", hf="q", heads=HEADS, nope_dim=NOPE, rope_dim=ROPE, cols=HIDDEN),
         rows(HEADS * (NOPE + ROPE), HIDDEN)),
        (kv_up(megatron="kv_up", hf="kv_b", heads=HEADS, nope_dim=NOPE, v_dim=V, kv_lora_rank=KV_LORA),
         rows(HEADS * (NOPE + V), KV_LORA)),
    ]  # fmt: skip
    return [(m, {m.hf: w}) for m, w in cases]


def test_kv_up_shard_is_whole_heads_of_k_nope_then_v() -> None:
    """Written out independently: at tp=2 rank r holds heads 2r, 2r+1, each as HF rows [k_nope (6); v (5)]."""
    m, hf = mla()[4]
    for r in range(2):
        shard = m.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=r))
        want = [row for h in (2 * r, 2 * r + 1) for row in range(h * 11, h * 11 + 11)]
        assert (shard[:, 0] / 1000).long().tolist() == want and shard.shape == (22, KV_LORA)


def test_kv_down_is_split_over_tp_across_the_latent_rope_boundary() -> None:
    """megatron-core's local linear_kv_down_proj is column parallel: at tp=2 rank 1 holds the latent's last 4 rows
    and the 2 RoPE-key rows (the forward all-gathers before splitting them)."""
    m, hf = mla()[1]
    shards = [m.to_shard(hf, ParallelLayout(tp=2), RankCoord(tp_rank=r)) for r in range(2)]
    assert [(s[:, 0] / 1000).long().tolist() for s in shards] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_mla_mappings_roundtrip_bitwise(tp: int) -> None:
    for mapping, hf in mla():
        assert roundtrip(mapping, hf, ParallelLayout(tp=tp)) == [], mapping.megatron


def test_refusals_name_the_parameter() -> None:
    m, hf = mla()[4]
    with pytest.raises(MappingError, match="kv_up: 4 heads do not split over tp=8"):
        m.to_shard(hf, ParallelLayout(tp=8), RankCoord(tp_rank=0))
    with pytest.raises(MappingError, match=r"'kv_b' has shape \[44, 10\], expected \[40, 10\]"):
        kv_up(megatron="kv_up", hf="kv_b", heads=HEADS, nope_dim=NOPE, v_dim=V - 1, kv_lora_rank=KV_LORA).to_shard(
            hf, ParallelLayout(), RankCoord()
        )
    with pytest.raises(MappingError, match="kv_down: 12 rows do not split over tp=8"):
        mla()[1][0].to_shard(mla()[1][1], ParallelLayout(tp=8), RankCoord(tp_rank=0))


def test_planted_v_before_k_nope_is_caught_at_the_first_v_row() -> None:
    """A shard holding each head as [v; k_nope] differs from ours at its first row (HF row 6, v's first, where k_nope
    row 0 belongs)."""
    m, hf = mla()[4]
    ours = m.to_shard(hf, ParallelLayout(), RankCoord())
    buggy = torch.cat([torch.cat([h[NOPE:], h[:NOPE]]) for h in ours.split(NOPE + V)])
    finding = compare_bits(m.megatron, ours, buggy)
    assert finding is not None and finding.detail["first_index"] == [0, 0]
    assert "got 6000.0" in finding.message and "expected 0.0" in finding.message


# --- the registry over the tiny fixtures' real names --------------------------------------------------------------


def megatron_names(*, q_lora: bool, mtp: bool) -> list[str]:
    """The local spec's parameters of a 4-layer DeepSeek-V3 model (layer 0 dense, 8 experts), as megatron-core 0.19.2
    names them, with MTP layer 0."""
    attention = ["kv_layernorm.weight", "linear_kv_down_proj.weight", "linear_kv_up_proj.weight", "linear_proj.weight"]
    attention += (
        ["q_layernorm.weight", "linear_q_down_proj.weight", "linear_q_up_proj.weight"]
        if q_lora
        else ["linear_q_proj.weight"]
    )
    moe = ["router.weight", "router.expert_bias", "shared_experts.linear_fc1.weight",
           "shared_experts.linear_fc2.weight"]  # fmt: skip
    moe += [f"experts.local_experts.{e}.linear_fc{k}.weight" for e in range(8) for k in (1, 2)]

    def layer(prefix: str, dense: bool) -> list[str]:
        mlp = ["linear_fc1.weight", "linear_fc2.weight"] if dense else moe
        return [f"{prefix}.{p}" for p in ("input_layernorm.weight", "pre_mlp_layernorm.weight")] + [
            *(f"{prefix}.self_attention.{p}" for p in attention),
            *(f"{prefix}.mlp.{p}" for p in mlp),
        ]

    names = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight"]
    for i in range(4):
        names += layer(f"decoder.layers.{i}", dense=i == 0)
    if mtp:
        names += layer("mtp.layers.0.mtp_model_layer", dense=False)
        names += [f"mtp.layers.0.{p}.weight" for p in ("enorm", "hnorm", "eh_proj", "final_layernorm")]
    return names


def fixture(name: str) -> tuple[Geometry, list[str]]:
    """The fixture's geometry and HF tensor names, from its stored layout (no build)."""
    from convcheck.fixtures import get_spec
    from convcheck.fixtures.reference import load_layout

    layout = load_layout(get_spec(name))
    return Geometry.from_hf_config(json.loads(layout["config"])), [t["name"] for t in layout["tensors"]]


COPIES = ("model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight")


def test_geometry_reads_the_mla_widths() -> None:
    geometry, _ = fixture("deepseek-v3")
    assert (geometry.q_lora_rank, geometry.kv_lora_rank, geometry.qk_nope_head_dim, geometry.qk_rope_head_dim,
            geometry.v_head_dim, geometry.num_layers, geometry.num_experts, geometry.mtp_layers) == (
        24, 16, 12, 8, 10, 4, 8, 1)  # fmt: skip
    assert (fixture("moonlight")[0].q_lora_rank, fixture("moonlight")[0].mtp_layers) == (0, 0)  # q_lora_rank null


@pytest.mark.parametrize("name", ["deepseek-v3", "moonlight", "glm4.7-flash"])
def test_registry_covers_the_deepseek_style_fixtures_exactly_once(name: str) -> None:
    """Every parameter mapped once, every HF tensor produced once: the MTP layer's embed_tokens / shared_head.head as
    copies of the embedding and of lm_head."""
    geometry, hf = fixture(name)
    mtp = name != "moonlight"
    meg = megatron_names(q_lora=mtp, mtp=mtp)
    architecture = "Glm4MoeLiteForCausalLM" if name.startswith("glm") else "DeepseekV3ForCausalLM"
    registry = build_registry(architecture, geometry, meg, hf)
    assert sorted(registry.mappings) == sorted(meg) and registry.problems == ()
    embedding, head = registry.get("embedding.word_embeddings.weight"), registry.get("output_layer.weight")
    if mtp:
        assert isinstance(embedding, WithCopies) and isinstance(head, WithCopies)
        assert (embedding.copies, head.copies) == (
            ((COPIES[0], "model.embed_tokens.weight"),),
            ((COPIES[1], "lm_head.weight"),),
        )
    else:
        assert isinstance(embedding, Split) and isinstance(head, Split)


def test_the_copies_are_rebuilt_bitwise_from_the_embedding_and_lm_head_shards() -> None:
    """At TP2 the vocabulary shards rebuild model.embed_tokens and its MTP copy, lm_head and its; when tied, both
    copies come from the embedding and the output layer produces nothing of its own."""
    geometry, hf = fixture("deepseek-v3")
    vocab = {n: rows(152, 32) + i for i, n in enumerate(("model.embed_tokens.weight", "lm_head.weight"))}
    source = {**vocab, COPIES[0]: vocab["model.embed_tokens.weight"], COPIES[1]: vocab["lm_head.weight"]}
    registry = build_registry("DeepseekV3ForCausalLM", geometry, megatron_names(q_lora=True, mtp=True), hf)
    for param in ("embedding.word_embeddings.weight", "output_layer.weight"):
        assert roundtrip(registry.get(param), source, ParallelLayout(tp=2)) == [], param
    tied = build_registry("DeepseekV3ForCausalLM", geometry, megatron_names(q_lora=True, mtp=True),
                          [n for n in hf if n != "lm_head.weight"], tied=True)  # fmt: skip
    assert tied.copies == {"output_layer.weight"} and tied.problems == ()
    assert tied.get("embedding.word_embeddings.weight").hf_names == ("model.embed_tokens.weight", *COPIES)
    with pytest.raises(MappingError, match=r"emb: copies of \['lm_head.weight'\], which it does not produce"):
        WithCopies(inner=Split(megatron="emb", hf="model.embed_tokens.weight"), copies=((COPIES[1], "lm_head.weight"),))


def test_registry_maps_mtp_to_layer_l_plus_k_with_mla_shapes() -> None:
    geometry, hf = fixture("deepseek-v3")
    registry = build_registry("DeepseekV3ForCausalLM", geometry, megatron_names(q_lora=True, mtp=True), hf)
    get = registry.get
    assert get("mtp.layers.0.eh_proj.weight") == Split(megatron="mtp.layers.0.eh_proj.weight",
                                                       hf="model.layers.4.eh_proj.weight")  # fmt: skip
    assert get("mtp.layers.0.final_layernorm.weight") == Replicated(
        megatron="mtp.layers.0.final_layernorm.weight", hf="model.layers.4.shared_head.norm.weight"
    )
    kv_b = get("mtp.layers.0.mtp_model_layer.self_attention.linear_kv_up_proj.weight")
    assert (kv_b.hf, kv_b.repeats, kv_b.parts, kv_b.cols) == (
        "model.layers.4.self_attn.kv_b_proj.weight",
        4,
        (("k_nope", 12), ("v", 10)),
        16,
    )
    kv_a = get("decoder.layers.2.self_attention.linear_kv_down_proj.weight")
    assert (kv_a.hf, kv_a.rows, kv_a.cols) == ("model.layers.2.self_attn.kv_a_proj_with_mqa.weight", 24, 32)
    shared = get("decoder.layers.1.mlp.shared_experts.linear_fc1.weight")
    assert isinstance(shared, Gated) and shared.axis == "tp" and shared.expert is None
    assert get("decoder.layers.3.mlp.experts.local_experts.7.linear_fc2.weight").expert == 7
    bias = get("decoder.layers.1.mlp.router.expert_bias")
    assert bias == Replicated(megatron=bias.megatron, hf="model.layers.1.mlp.gate.e_score_correction_bias")


def test_registry_names_an_mtp_layer_off_by_one_and_every_other_offender() -> None:
    """Geometry with one layer fewer puts the MTP layer at model.layers.3 (an MTP index off by one): every MTP
    tensor, the copies included, is produced twice or not at all, named; an unknown parameter too."""
    geometry, hf = fixture("deepseek-v3")
    shifted = replace(geometry, num_layers=3)
    meg = megatron_names(q_lora=True, mtp=True) + ["decoder.layers.0.self_attention.mystery.weight"]
    with pytest.raises(CoverageError) as info:
        build_registry("DeepseekV3ForCausalLM", shifted, meg, hf)
    text = str(info.value)
    assert "decoder.layers.0.self_attention.mystery.weight: Megatron parameter has no mapping" in text
    assert "model.layers.3.self_attn.kv_b_proj.weight: HF tensor would be produced 2 times" in text
    assert "model.layers.4.self_attn.kv_b_proj.weight: HF tensor would be produced 0 times" in text
    assert "model.layers.3.eh_proj.weight: produced by a mapping but not an HF tensor" in text
    assert "model.layers.4.embed_tokens.weight: HF tensor would be produced 0 times" in text  # copied at layer 3
