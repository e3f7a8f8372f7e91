"""Weight-sync building blocks without ranks: buckets, deltas and their wire format, fused packing, adapter specs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from convcheck.compare.bits import bytes_equal, int_view
from convcheck.errors import BadInput, NotCovered
from convcheck.sync import delta as wire
from convcheck.sync.adapters import check_adapters, load_receiver, load_sender, normalize_sender
from convcheck.sync.buckets import ALIGN, Bucket, pack_buckets, unpack_bucket
from convcheck.sync.fusion import Geometry, locate, one_layout_gap, pack, slot_of
from convcheck.sync.receivers import FusedReceiver
from convcheck.sync.stream import describe_item

CONFIG = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2, "hidden_size": 8, "num_experts": 2}


def distinct(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """A tensor of pairwise distinct values (a permutation of n bf16 magnitudes), so any misplacement shows."""
    n = 1
    for d in shape:
        n *= d
    values = torch.arange(1, n + 1, dtype=torch.float32) / (n + 1)
    return values[torch.randperm(n, generator=torch.Generator().manual_seed(seed))].to(dtype).reshape(shape)


def items() -> list[tuple[str, torch.Tensor]]:
    return [
        ("a.weight", distinct(3, 5)),
        ("b.bias", distinct(7, dtype=torch.float32, seed=1)),
        ("c.weight", distinct(40, 8, seed=2)),
        ("d.flag", torch.tensor([True, False, True])),
        ("e.scalar", torch.tensor(3, dtype=torch.int64)),
    ]


def test_buckets_round_trip_bitwise_within_the_bound() -> None:
    buckets = list(pack_buckets(items(), bucket_bytes=128))
    assert len(buckets) >= 3
    for bucket in buckets:
        assert bucket.buffer.dtype == torch.uint8
        assert bucket.buffer.numel() <= 128 or len(bucket.entries) == 1  # only an oversized tensor exceeds it
        assert all(e.offset % ALIGN == 0 for e in bucket.entries)
    out = [pair for bucket in buckets for pair in unpack_bucket(bucket)]
    assert [n for n, _ in out] == [n for n, _ in items()]
    for (_, want), (_, got) in zip(items(), out):
        assert got.dtype == want.dtype and got.shape == want.shape and bytes_equal(want, got)


def test_bucket_offset_off_by_one_corrupts_the_named_tensor() -> None:
    (bucket,) = pack_buckets(items(), bucket_bytes=1 << 20)
    entries = list(bucket.entries)
    entries[1] = replace(entries[1], offset=entries[1].offset + 1)
    out = dict(unpack_bucket(Bucket(buffer=bucket.buffer, entries=tuple(entries))))
    assert not bytes_equal(dict(items())["b.bias"], out["b.bias"])
    assert bytes_equal(dict(items())["a.weight"], out["a.weight"])
    entries[-1] = replace(entries[-1], offset=bucket.buffer.numel())
    with pytest.raises(ValueError, match="e.scalar"):
        list(unpack_bucket(Bucket(buffer=bucket.buffer, entries=tuple(entries))))


def previous_and_new() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    previous = dict(items()[:3])
    new = {k: v.clone() for k, v in previous.items()}
    int_view(new["c.weight"])[[0, 17, 319]] ^= 1
    new["b.bias"][3] = -0.0 if previous["b.bias"][3] == 0 else -previous["b.bias"][3]
    return previous, new


def test_delta_holds_only_changed_elements_and_applies_bitwise() -> None:
    previous, new = previous_and_new()
    delta = wire.build_delta(previous, new)
    assert delta.names == ["b.bias", "c.weight"]
    assert delta.entries[1].indices.tolist() == [0, 17, 319] and delta.elements == 4
    applied = wire.apply_delta(previous, wire.decode(wire.encode(delta)))
    for name in new:
        assert bytes_equal(new[name], applied[name]), name
    assert applied["a.weight"] is previous["a.weight"]  # untouched tensors are shared, not copied
    assert bytes_equal(previous["c.weight"], items()[2][1])  # the previous state is left as it was


def test_delta_counts_negative_zero_and_nan_payloads() -> None:
    previous = {"x": torch.tensor([0.0, float("nan"), 1.0])}
    new = {"x": torch.tensor([-0.0, float("nan"), 1.0])}
    int_view(new["x"])[1] = int(int_view(previous["x"])[1]) ^ 1  # another NaN payload
    delta = wire.build_delta(previous, new)
    assert delta.entries[0].indices.tolist() == [0, 1]
    assert bytes_equal(new["x"], wire.apply_delta(previous, delta)["x"])


def test_empty_delta_is_a_no_op_through_the_wire() -> None:
    previous, _ = previous_and_new()
    assert wire.build_delta(previous, previous).entries == ()
    empty = wire.decode(wire.encode(wire.Delta()))
    assert empty.entries == ()
    same = wire.apply_delta(previous, empty)
    assert all(same[n] is previous[n] for n in previous) and set(same) == set(previous)


def test_delta_replaces_removes_and_refuses_a_wrong_base() -> None:
    previous, new = previous_and_new()
    new["a.weight"] = new["a.weight"].float()  # dtype change: whole tensor
    new["f.new"] = distinct(2, 2)
    del new["b.bias"]
    delta = wire.decode(wire.encode(wire.build_delta(previous, new)))
    assert [(e.name, e.op) for e in delta.entries] == [
        ("a.weight", "replace"),
        ("b.bias", "remove"),
        ("c.weight", "patch"),
        ("f.new", "replace"),
    ]
    applied = wire.apply_delta(previous, delta)
    assert set(applied) == set(new) and all(bytes_equal(new[n], applied[n]) for n in new)
    with pytest.raises(wire.DeltaError, match="c.weight: the state's tensor is not the base"):
        wire.apply_delta({**previous, "c.weight": new["c.weight"]}, delta)
    with pytest.raises(wire.DeltaError, match="not a convcheck-delta"):
        wire.decode(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")


def test_delta_index_out_of_range_is_refused() -> None:
    previous, new = previous_and_new()
    delta = wire.build_delta(previous, new)
    bad = replace(delta.entries[1], indices=torch.tensor([0, 17, 320]))
    with pytest.raises(wire.DeltaError, match="c.weight: an index lies outside"):
        wire.apply_delta(previous, wire.Delta((delta.entries[0], bad)))


def test_fused_slots_follow_the_stacked_parameter_names() -> None:
    g = Geometry.from_config(CONFIG)
    assert (g.q_rows, g.kv_rows, g.experts, g.gated) == (8, 4, 2, True)
    assert slot_of("model.layers.0.self_attn.v_proj.bias", g).param == "model.layers.0.self_attn.qkv_proj.bias"
    assert slot_of("model.layers.0.self_attn.v_proj.bias", g).row_start == 12
    assert slot_of("model.layers.0.mlp.up_proj.weight", g).shard == 1
    assert slot_of("model.layers.0.mlp.experts.1.gate_proj.weight", g).param == "model.layers.0.mlp.experts.w13_weight"
    assert slot_of("model.layers.0.mlp.experts.1.down_proj.weight", g).shard == "w2"
    assert slot_of("model.layers.0.mlp.gate.weight", g) is None  # the router stays as it is
    assert (
        slot_of("model.layers.0.mlp.up_proj.weight", Geometry.from_config({**CONFIG, "mlp_hidden_act": "relu2"}))
        is None
    )


def layer_tensors() -> dict[str, torch.Tensor]:
    p = "model.layers.0"
    names = {
        f"{p}.self_attn.q_proj.weight": (8, 8),
        f"{p}.self_attn.k_proj.weight": (4, 8),
        f"{p}.self_attn.v_proj.weight": (4, 8),
        f"{p}.self_attn.q_proj.bias": (8,),
        f"{p}.self_attn.k_proj.bias": (4,),
        f"{p}.self_attn.v_proj.bias": (4,),
        f"{p}.mlp.gate_proj.weight": (6, 8),
        f"{p}.mlp.up_proj.weight": (6, 8),
        f"{p}.moe.experts.0.gate_proj.weight": (3, 8),
        f"{p}.moe.experts.0.up_proj.weight": (3, 8),
        f"{p}.moe.experts.0.down_proj.weight": (8, 3),
        f"{p}.moe.experts.1.gate_proj.weight": (3, 8),
        f"{p}.moe.experts.1.up_proj.weight": (3, 8),
        f"{p}.moe.experts.1.down_proj.weight": (8, 3),
        f"{p}.input_layernorm.weight": (8,),
    }
    return {name: distinct(*shape, seed=i) for i, (name, shape) in enumerate(names.items())}


def test_pack_stacks_as_inference_engines_do() -> None:
    hf, p = layer_tensors(), "model.layers.0"
    packed = pack(hf, Geometry.from_config(CONFIG))
    assert sorted(packed) == sorted(
        [
            f"{p}.self_attn.qkv_proj.weight",
            f"{p}.self_attn.qkv_proj.bias",
            f"{p}.mlp.gate_up_proj.weight",
            f"{p}.moe.experts.w13_weight",
            f"{p}.moe.experts.w2_weight",
            f"{p}.input_layernorm.weight",
        ]
    )
    qkv = packed[f"{p}.self_attn.qkv_proj.weight"]
    assert bytes_equal(qkv[8:12], hf[f"{p}.self_attn.k_proj.weight"]) and bytes_equal(
        qkv[12:], hf[f"{p}.self_attn.v_proj.weight"]
    )
    assert bytes_equal(packed[f"{p}.mlp.gate_up_proj.weight"][6:], hf[f"{p}.mlp.up_proj.weight"])
    w13 = packed[f"{p}.moe.experts.w13_weight"]
    assert w13.shape == (2, 6, 8) and bytes_equal(w13[1, :3], hf[f"{p}.moe.experts.1.gate_proj.weight"])
    assert bytes_equal(w13[1, 3:], hf[f"{p}.moe.experts.1.up_proj.weight"])
    assert bytes_equal(packed[f"{p}.moe.experts.w2_weight"][0], hf[f"{p}.moe.experts.0.down_proj.weight"])


@pytest.mark.parametrize("order", ["forward", "reversed", "interleaved"])
def test_fused_receiver_loads_piecewise_in_any_order(order: str) -> None:
    hf = layer_tensors()
    pairs = list(hf.items())
    pairs = {"forward": pairs, "reversed": pairs[::-1], "interleaved": pairs[::2] + pairs[1::2]}[order]
    receiver = FusedReceiver(config=CONFIG)
    for pair in pairs:  # one call per tensor: the pieces of a fused parameter arrive in separate calls
        receiver.load_weights([pair])
    state, expected = dict(receiver.named_parameters()), receiver.expected(hf)
    assert sorted(state) == sorted(expected)
    assert all(bytes_equal(expected[n], state[n]) for n in state)


def test_fused_receiver_leaves_a_missing_piece_nan_and_locates_it() -> None:
    hf = layer_tensors()
    receiver = FusedReceiver(config=CONFIG)
    receiver.load_weights((n, t) for n, t in hf.items() if n != "model.layers.0.self_attn.v_proj.weight")
    qkv = dict(receiver.named_parameters())["model.layers.0.self_attn.qkv_proj.weight"]
    assert bool(qkv[12:].isnan().all()) and not bool(qkv[:12].isnan().any())
    assert receiver.locate("model.layers.0.self_attn.qkv_proj.weight", (13, 2)) == (
        "model.layers.0.self_attn.v_proj.weight",
        (1, 2),
    )
    assert receiver.locate("model.layers.0.moe.experts.w13_weight", (1, 4, 0)) == (
        "model.layers.0.moe.experts.1.up_proj.weight",
        (1, 0),
    )
    assert locate("x.gate_up_proj.weight", (12, 8), (5, 1), Geometry.from_config(CONFIG)) == (
        "x.gate_proj.weight",
        (5, 1),
    )
    with pytest.raises(ValueError, match="k_proj.weight: shape"):
        receiver.load_weights([("model.layers.0.self_attn.k_proj.weight", distinct(5, 8))])


def test_sender_items_are_checked() -> None:
    known = {"a.weight": None}
    assert describe_item(("a.weight", torch.zeros(1)), known) is None
    assert "not a tensor of the source" in describe_item(("zzz", torch.zeros(1)), known)
    assert "list instead of a tensor" in describe_item(("a.weight", [1.0]), known)
    assert "instead of a (name, tensor) pair" in describe_item(torch.zeros(2), known)


def test_adapter_specs_resolve_or_are_bad_input(tmp_path: Path) -> None:
    assert normalize_sender("bridge") is None and normalize_sender("bucketed") == "bucketed"
    assert load_sender("bucketed").__name__ == "bucketed"
    assert load_receiver(None).__name__ == "HFReceiver" and load_receiver("fused") is FusedReceiver
    with pytest.raises(BadInput, match="has no load_weights"):
        load_receiver("convcheck.mutants.sync:NoLoadWeights")
    with pytest.raises(BadInput, match="has no attribute 'nope'"):
        check_adapters("convcheck.mutants.sync:nope", None, 64)
    with pytest.raises(BadInput, match="cannot import"):
        check_adapters("no_such_module_xyz:send", None, 64)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(BadInput, match="cannot be imported: RuntimeError: boom at import"):
        check_adapters(f"{broken}:send", None, 64)
    with pytest.raises(BadInput, match="chunk-mb must be positive"):
        check_adapters(None, None, 0)


def test_the_hf_receiver_keeps_fp32_what_from_pretrained_keeps_and_drops_only_mtp_layers(tmp_path: Path) -> None:
    """DeepSeek-V3: e_score_correction_bias stays float32 in a bf16 model (`_keep_in_fp32_modules_strict`), an MTP
    layer's tensor (no HF module holds it) is dropped and counted, any other unknown name still raises."""
    from transformers import AutoConfig

    from convcheck.fixtures.build import build_fixture
    from convcheck.sync.receivers import HFReceiver

    receiver = HFReceiver(AutoConfig.from_pretrained(build_fixture("deepseek-v3")))
    state = receiver.state_dict()
    assert state["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert state["model.layers.1.mlp.gate.weight"].dtype == torch.bfloat16
    receiver.load_weights([("model.layers.4.enorm.weight", torch.ones(32, dtype=torch.bfloat16))])
    assert receiver.not_held == {"model.layers.4.enorm.weight"}
    with pytest.raises(KeyError, match="'model.layers.3.enorm.weight' is not a tensor of DeepseekV3ForCausalLM"):
        receiver.load_weights([("model.layers.3.enorm.weight", torch.ones(32, dtype=torch.bfloat16))])


def test_the_fused_receiver_refuses_a_model_whose_layers_differ_in_attention_layout() -> None:
    """Gemma 4's layers differ in q / k / v layout (wider full-attention heads, keys as values, KV-shared layers): one
    row layout for all layers cannot hold them, so the fused receiver is not-covered (NotCovered), never a finding;
    a uniform model's config builds."""
    uniform = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "hidden_size": 16}
    assert one_layout_gap(uniform) is None and FusedReceiver(uniform).params == {}
    cases = {
        "global_head_dim": (16, "its full-attention layers' heads are 16 wide, the other layers' 8"),
        "attention_k_eq_v": (True, "its full-attention layers use their keys as values and store no v_proj"),
        "num_kv_shared_layers": (2, "its last 2 layers reuse an earlier layer's keys and values and store no k_proj / "
                                    "v_proj"),
    }  # fmt: skip
    for knob, (value, why) in cases.items():
        assert one_layout_gap({**uniform, knob: value}) == why
        assert one_layout_gap({"text_config": {**uniform, knob: value}}) == why
        with pytest.raises(NotCovered, match="fused receiver stacks one q / k / v layout for every layer, and its"):
            FusedReceiver({**uniform, knob: value})


def test_the_hf_receiver_loads_fused_experts_in_either_orientation_as_transformers_does() -> None:
    """Qwen3-VL-MoE: published checkpoints store experts.gate_up_proj [E, H, 2F], transformers 5's model holds (and
    saves) [E, 2F, H], and its loader transposes only a tensor whose shape is not the model's. The receiver loads the
    published orientation transposed, reads it back as it came, and puts each element where transformers' loader
    puts it: a planted swap of two elements is the only difference from the source, found at its first index."""
    from transformers import AutoConfig

    from convcheck.fixtures.build import build_fixture
    from convcheck.sync.receivers import HFReceiver

    config = AutoConfig.from_pretrained(build_fixture("qwen3-vl-moe"))
    name = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    receiver = HFReceiver(config)
    experts, hidden, wide = 8, config.text_config.hidden_size, 2 * config.text_config.moe_intermediate_size
    published = distinct(experts, hidden, wide)
    receiver.load_weights([(name, published)])
    assert receiver.transposed == {name}
    param = dict(receiver.model.named_parameters())[name]
    assert bytes_equal(param.data, published.transpose(1, 2))  # where transformers' loader puts each element
    assert bytes_equal(receiver.state_dict()[name], published)
    as_saved = HFReceiver(config)
    as_saved.load_weights([(name, published.transpose(1, 2).contiguous())])
    assert as_saved.transposed == set() and bytes_equal(as_saved.state_dict()[name], published.transpose(1, 2))
    wrong = published.clone()
    wrong[0, 0, 0], wrong[0, 0, 1] = published[0, 0, 1], published[0, 0, 0]
    planted = HFReceiver(config)
    planted.load_weights([(name, wrong)])
    got = int_view(planted.state_dict()[name]).reshape(published.shape)
    differs = (got != int_view(published).reshape(published.shape)).nonzero().tolist()
    assert differs == [[0, 0, 0], [0, 0, 1]]
    with pytest.raises(ValueError, match=r"shape \[8, 4, 4\], the model expects"):
        HFReceiver(config).load_weights([(name, distinct(experts, 4, 4))])


def test_fused_geometry_reads_a_vision_language_config_through_its_text_config() -> None:
    text = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_size": 32, "num_experts": 8}
    wrapped = {"model_type": "qwen3_vl_moe", "text_config": text, "vision_config": {"num_heads": 2}}
    assert (
        Geometry.from_config(wrapped)
        == Geometry.from_config(text)
        == Geometry(q_rows=32, kv_rows=16, experts=8, gated=True)
    )


def test_the_hf_receiver_takes_fused_experts_under_the_models_own_name_as_transformers_does() -> None:
    """Qwen3.6-MoE: the published checkpoint stores experts.gate_up_proj fused, under the model's own parameter name,
    which transformers' loader loads as it is (its conversion mapping splits experts per expert only on save). The
    receiver loads it whole, reads it back under that name (not split per expert), expects the source there, and a
    planted swap of two elements is the only difference, at its first index."""
    from transformers import AutoConfig

    from convcheck.fixtures.build import build_fixture
    from convcheck.sync.receivers import HFReceiver

    config = AutoConfig.from_pretrained(build_fixture("qwen3.6-moe"))
    name = "model.layers.0.mlp.experts.gate_up_proj"
    receiver = HFReceiver(config)
    shape = tuple(dict(receiver.model.named_parameters())[name].shape)
    fused = distinct(*shape)
    wrong = fused.clone()
    wrong[0, 0, 0], wrong[0, 0, 1] = fused[0, 0, 1], fused[0, 0, 0]
    receiver.load_weights([(name, wrong)])
    state = receiver.state_dict()
    assert receiver.loaded_as_held == {name} and "model.layers.0.mlp.experts.0.gate_proj.weight" not in state
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in state  # a layer sent per expert stays per expert
    assert receiver.expected({name: fused})[name] is fused
    got = int_view(state[name]).reshape(shape)
    assert (got != int_view(fused).reshape(shape)).nonzero().tolist() == [[0, 0, 0], [0, 0, 1]]
    with pytest.raises(ValueError, match=rf"{name}: shape \[2, 2\], the model expects"):
        HFReceiver(config).load_weights([(name, distinct(2, 2))])


def test_the_hf_receiver_takes_the_published_siglip_names_and_reads_them_back_so() -> None:
    """Gemma 3 VL: a tower tensor sent under the published `vision_tower.vision_model.*` name lands where transformers'
    loader puts it (its `vision_tower.*` parameter), is read back and expected under the name it came in; a planted
    element is named there; a name no prefix removal places still raises."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from convcheck.fixtures.build import build_fixture
    from convcheck.sync.receivers import HFReceiver

    folder = build_fixture("gemma3-vl")
    source: dict[str, Any] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        source.update(load_file(str(shard)))
    name = "vision_tower.vision_model.encoder.layers.1.self_attn.k_proj.weight"
    receiver = HFReceiver(AutoConfig.from_pretrained(folder))
    receiver.load_weights(source.items())
    assert receiver.aliases[name] == "vision_tower.encoder.layers.1.self_attn.k_proj.weight"
    param = dict(receiver.model.named_parameters())["model.vision_tower.encoder.layers.1.self_attn.k_proj.weight"]
    assert bytes_equal(param.data, source[name])
    state, expected = receiver.state_dict(), receiver.expected(source)
    assert name in state and name in expected and "vision_tower.encoder.layers.1.self_attn.k_proj.weight" not in state
    assert set(state) == set(expected) == {*source, "language_model.lm_head.weight"}  # the tied head: the embedding
    assert all(bytes_equal(state[k], expected[k]) for k in expected)
    wrong = source[name].clone()
    wrong[3, 5] = -wrong[3, 5]
    receiver.load_weights([(name, wrong)])
    got, want = int_view(receiver.state_dict()[name]), int_view(expected[name])
    assert (got != want).reshape(wrong.shape).nonzero().tolist() == [[3, 5]]
    with pytest.raises(KeyError, match="'vision_tower.vision_model.head.probe' is not a tensor of"):
        receiver.load_weights([("vision_tower.vision_model.head.probe", torch.ones(1, 1, 16))])
