"""convcheck.probe.shared: which routed-expert tasks share a probe run, and the renamed slots they take (real
Megatron-Bridge mappings and conversion tasks; the probe run itself is exercised by tests/test_differential.py)."""

from __future__ import annotations

from typing import Any

import pytest

from convcheck.probe.run import ProbeSlot
from convcheck.probe.shared import HF_EXPERT, SharedProbes, _Entry, numbers, probe_key, same_slots


def expert_key(task: Any, rank: int) -> tuple[Any, ...] | None:
    """probe_key of a routed-expert task; None for any other task."""
    found = numbers(task)
    return probe_key(task, rank) if found is not None and "expert" in found else None


def layer_key(task: Any, rank: int) -> tuple[Any, ...] | None:
    """probe_key of a layer's non-expert task; None for a routed expert or a task of no layer."""
    found = numbers(task)
    return probe_key(task, rank) if found is not None and "expert" not in found else None


def renamed_slots(slots: dict[str, ProbeSlot], shift: int, ids: Any = HF_EXPERT) -> dict[str, ProbeSlot]:
    """`slots` with every expert id (with `ids` LAYER: every layer number) of their HF names moved by `shift`."""
    return _Entry(at={}, slots=slots).renamed({"expert" if ids is HF_EXPERT else "layer": shift})


@pytest.fixture(scope="module")
def upstream() -> Any:
    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge.models.conversion import model_bridge, param_mapping

    return model_bridge, param_mapping


def _task(upstream: Any, layer: int, expert: int, rows: int = 8) -> Any:
    import torch

    model_bridge, param_mapping = upstream
    mapping = param_mapping.GatedMLPMapping(
        megatron_param=f"decoder.layers.{layer}.mlp.experts.local_experts.{expert}.linear_fc1.weight",
        gate=f"model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight",
        up=f"model.layers.{layer}.mlp.experts.{expert}.up_proj.weight",
    )
    name = mapping.megatron_param
    weight = torch.zeros(rows, 4, dtype=torch.bfloat16)
    return model_bridge.WeightConversionTask(
        param_name=name, global_param_name=name, mapping=mapping, pp_rank=0, megatron_module=None, param_weight=weight
    )


def _slots(expert: int, start: int = 0) -> dict[str, ProbeSlot]:
    import torch

    runs = torch.tensor([[0, start, 16]], dtype=torch.int64)
    names = [f"model.layers.1.mlp.experts.{e}.{p}_proj.weight" for e in (expert, expert + 4) for p in ("gate", "up")]
    return {n: ProbeSlot(hf_name=n, shape=(4, 4), runs=runs, writer=(("ep", 0),)) for n in names}


def test_only_the_expert_and_layer_numbers_are_hidden(upstream: Any) -> None:
    three, five = expert_key(_task(upstream, 1, 3), 0), expert_key(_task(upstream, 1, 5), 0)
    assert three is not None and three == five == expert_key(_task(upstream, 2, 3), 0)  # another expert, layer
    assert expert_key(_task(upstream, 1, 3), 1) != three  # another rank
    assert expert_key(_task(upstream, 1, 3, rows=16), 0) != three  # another shard geometry
    model_bridge, param_mapping = upstream
    dense = model_bridge.WeightConversionTask(
        param_name="decoder.layers.1.mlp.linear_fc1.weight",
        global_param_name="decoder.layers.1.mlp.linear_fc1.weight",
        mapping=param_mapping.GatedMLPMapping(
            megatron_param="decoder.layers.1.mlp.linear_fc1.weight",
            gate="model.layers.1.mlp.gate_proj.weight",
            up="model.layers.1.mlp.up_proj.weight",
        ),
        pp_rank=0,
        param_weight=_task(upstream, 1, 3).param_weight,
    )
    assert expert_key(dense, 0) is None


def test_the_first_two_are_probed_and_must_agree_then_the_rest_are_renamed(upstream: Any) -> None:
    shared, probed = SharedProbes(), []

    def probe(expert: int, start: int = 0) -> Any:
        return lambda: probed.append(expert) or _slots(expert, start)

    for expert in range(4):
        got = shared.slots(_task(upstream, 1, expert), 0, probe(expert))
        assert sorted(got) == sorted(_slots(expert))
        assert all(s.hf_name == n for n, s in got.items())
    assert probed == [0, 1] and shared.shared == 2

    off, probed = SharedProbes(), []
    off.slots(_task(upstream, 1, 0), 0, probe(0))
    off.slots(_task(upstream, 1, 1), 0, probe(1, start=16))  # the second expert's probe places its elements elsewhere
    off.slots(_task(upstream, 1, 2), 0, probe(2))
    assert probed == [0, 1, 2] and off.shared == 0  # so every later expert of that key is probed


def _grid_slots(layer: int, expert: int, start: int = 0) -> dict[str, ProbeSlot]:
    import torch

    runs = torch.tensor([[0, start, 16]], dtype=torch.int64)
    experts = (expert, expert + 4)
    names = [f"model.layers.{layer}.mlp.experts.{e}.{p}_proj.weight" for e in experts for p in ("gate", "up")]
    return {n: ProbeSlot(hf_name=n, shape=(4, 4), runs=runs, writer=(("ep", 0),)) for n in names}


def test_experts_of_every_layer_share_once_both_numbers_are_confirmed(upstream: Any) -> None:
    """Layers 2-4 x experts 0-3: the first expert, the second of the first layer (confirms the expert number) and the
    first of the second layer (confirms the layer number) are probed, the other nine take renamed slots named for
    their own layer and experts."""
    shared, probed = SharedProbes(), []

    def probe(layer: int, expert: int, start: int = 0) -> Any:
        return lambda: probed.append((layer, expert)) or _grid_slots(layer, expert, start)

    for layer in (2, 3, 4):
        for expert in range(4):
            got = shared.slots(_task(upstream, layer, expert), 0, probe(layer, expert))
            assert sorted(got) == sorted(_grid_slots(layer, expert)) and same_slots(got, _grid_slots(layer, expert))
    assert probed == [(2, 0), (2, 1), (3, 0)] and shared.shared == 9

    # the first expert of the second layer places its elements elsewhere: the layer number is not confirmed, so
    # every expert of a later layer is probed; the first layer's later experts still share
    off, probed = SharedProbes(), []
    for layer in (2, 3, 4):
        for expert in range(3):
            off.slots(_task(upstream, layer, expert), 0, probe(layer, expert, 16 if (layer, expert) == (3, 0) else 0))
    assert probed == [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2)] and off.shared == 1

    # the same task twice (no number moved) is probed both times
    again, probed = SharedProbes(), []
    for _ in range(2):
        again.slots(_task(upstream, 2, 0), 0, probe(2, 0))
    assert probed == [(2, 0), (2, 0)] and again.shared == 0


def test_renamed_slots_move_every_expert_id() -> None:
    moved = renamed_slots(_slots(0), 3)
    assert sorted(moved) == sorted(_slots(3)) and same_slots(moved, _slots(3))
    assert not same_slots(moved, _slots(2)) and not same_slots(_slots(3), _slots(3, start=16))


def _dense(upstream: Any, layer: int, rows: int = 8, module: Any = None) -> Any:
    import torch

    model_bridge, param_mapping = upstream
    name = f"decoder.layers.{layer}.mlp.linear_fc1.weight"
    mapping = param_mapping.GatedMLPMapping(
        megatron_param=name, gate=f"model.layers.{layer}.mlp.gate_proj.weight",
        up=f"model.layers.{layer}.mlp.up_proj.weight",
    )  # fmt: skip
    weight = torch.zeros(rows, 4, dtype=torch.bfloat16)
    return model_bridge.WeightConversionTask(
        param_name=name, global_param_name=name, mapping=mapping, pp_rank=0, megatron_module=module,
        param_weight=weight,
    )  # fmt: skip


def _layer_slots(layer: int, start: int = 0) -> dict[str, ProbeSlot]:
    import torch

    runs = torch.tensor([[0, start, 16]], dtype=torch.int64)
    names = [f"model.layers.{layer}.mlp.{p}_proj.weight" for p in ("gate", "up")]
    return {n: ProbeSlot(hf_name=n, shape=(4, 4), runs=runs, writer=(("tp", 0),)) for n in names}


def test_a_layers_task_shares_with_the_same_task_of_other_layers(upstream: Any) -> None:
    """Non-expert tasks of successive layers: only the layer number is hidden; the first two are probed and must
    agree (renamed by the layer difference), the rest take the renamed slots; a second probe that disagrees turns
    sharing off for that kind."""
    from convcheck.probe.shared import LAYER

    assert layer_key(_dense(upstream, 0), 0) == layer_key(_dense(upstream, 7), 0) is not None
    assert layer_key(_dense(upstream, 0), 1) != layer_key(_dense(upstream, 0), 0)  # another rank
    assert layer_key(_dense(upstream, 0, rows=16), 0) != layer_key(_dense(upstream, 0), 0)  # another geometry
    assert layer_key(_dense(upstream, 0, module=object()), 0) != layer_key(_dense(upstream, 0), 0)  # another module
    assert layer_key(_task(upstream, 1, 3), 0) is None  # a routed expert shares by expert number instead
    shared, probed = SharedProbes(), []

    def probe(layer: int, start: int = 0) -> Any:
        return lambda: probed.append(layer) or _layer_slots(layer, start)

    for layer in range(4):
        got = shared.slots(_dense(upstream, layer), 0, probe(layer))
        assert sorted(got) == sorted(_layer_slots(layer)) and all(s.hf_name == n for n, s in got.items())
    assert probed == [0, 1] and shared.shared == 2
    off, probed = SharedProbes(), []
    for layer, start in ((0, 0), (1, 16), (2, 0)):
        off.slots(_dense(upstream, layer), 0, probe(layer, start))
    assert probed == [0, 1, 2] and off.shared == 0
    moved = renamed_slots(_layer_slots(1), 2, LAYER)
    assert sorted(moved) == sorted(_layer_slots(3)) and same_slots(moved, _layer_slots(3))


def test_layers_holding_equal_copies_of_one_config_share_and_other_configs_do_not(upstream: Any) -> None:
    """An MoE layer's experts hold their own deep copy of the model config (equal fields, but init_method partials of
    their own): the key reads the config's content, so the copies share; a config with another field does not."""
    import copy
    import dataclasses
    import functools

    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    from convcheck.probe.shared import config_token

    config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, init_method=functools.partial(
        torch.nn.init.normal_, mean=0.0, std=0.02))  # fmt: skip
    twin = copy.deepcopy(config)
    assert twin.init_method is not config.init_method and config_token(twin) == config_token(config)
    wider = dataclasses.replace(copy.deepcopy(config), ffn_hidden_size=config.ffn_hidden_size * 2)
    other_std = copy.deepcopy(config)
    other_std.init_method = functools.partial(torch.nn.init.normal_, mean=0.0, std=0.5)

    class Linear:
        def __init__(self, cfg: Any) -> None:
            self.config = cfg

    def module(cfg: Any) -> Any:
        return Linear(cfg)

    first = layer_key(_dense(upstream, 0, module=module(config)), 0)
    assert layer_key(_dense(upstream, 3, module=module(twin)), 0) == first
    assert layer_key(_dense(upstream, 3, module=module(wider)), 0) != first
    assert layer_key(_dense(upstream, 3, module=module(other_std)), 0) != first
    assert config_token(object()) != config_token(object())  # not a dataclass: by identity


NAMES = [
    "decoder.layers.3.mlp.experts.local_experts.12.linear_fc1.weight",
    "decoder.layers.3.mlp.experts.linear_fc1.weight12",
    "decoder.layers.3.mlp.experts.linear_fc2.bias7",
    "decoder.layers.3.mlp.shared_experts.linear_fc1.weight",
    "decoder.layers.11.self_attention.linear_qkv.weight",
    "decoder.layers.0.mlp.router.expert_bias",
    "mtp.layers.0.transformer_layer.mlp.experts.local_experts.2.linear_fc2.weight",
    "language_model.decoder.layers.7.self_attention.in_proj.weight",
    "backbone.layers.4.mixer.in_proj.weight",
    "model.layers.3.mlp.experts.12.gate_proj.weight",
    "model.layers.30.mlp.experts.5.down_proj.weight_scale_inv",
    "model.language_model.layers.10.mlp.experts.3.up_proj.weight",
    "model.layers.3.mlp.experts.gate_up_proj",
    "model.layers.3.mlp.shared_expert.down_proj.weight",
    "model.mtp.layers.0.mlp.experts.1.gate_proj.weight",
    "model.embed_tokens.weight",
    "lm_head.weight",
]
"""Megatron and HF spellings of layer and expert numbers across the families convcheck builds (sequential and TE
grouped experts, shared experts, MTP, VLM and hybrid prefixes, fused expert tensors, FP8 scales)."""


def _by_regex(name: str, experts: bool) -> str:
    """The numbers LAYER (and, with `experts`, HF_EXPERT and MEGATRON_EXPERT) find, each replaced by `*`."""
    from convcheck.probe.shared import HF_EXPERT, LAYER, MEGATRON_EXPERT

    spans = [m.span(2) for m in LAYER.finditer(name)]
    if experts:
        spans += [m.span(2) for m in HF_EXPERT.finditer(name)]
        spans += [m.span(g) for m in MEGATRON_EXPERT.finditer(name) for g in (1, 2) if m.group(g) is not None]
    out = name
    for start, end in sorted(set(spans), reverse=True):
        out = out[:start] + "*" + out[end:]
    return out


@pytest.mark.parametrize("experts", [False, True])
def test_hidden_names_the_numbers_the_regexes_find(experts: bool) -> None:
    """probe.shared._hidden splits at the dots for speed; it must hide exactly what its regexes would."""
    from convcheck.probe.shared import _hidden

    assert [_hidden(n, experts) for n in NAMES] == [_by_regex(n, experts) for n in NAMES]
    assert _hidden("decoder.layers.3.mlp.experts.local_experts.12.linear_fc1.weight", True) == (
        "decoder.layers.*.mlp.experts.local_experts.*.linear_fc1.weight"
    )


@pytest.mark.parametrize("experts", [False, True])
def test_one_pass_parse_finds_the_numbers_and_hides_what_the_regexes_do(experts: bool) -> None:
    """probe.shared._parse reads a name once for numbers() and the probe key: LAYER's first number, MEGATRON_EXPERT's
    expert number and _hidden's name, on every spelling of NAMES (and a few that end or start oddly)."""
    from convcheck.probe.shared import LAYER, MEGATRON_EXPERT, _hidden, _parse

    odd = ["layers.3.x", "a.layers.3", "x.local_experts.4", "weight5", "a.bias12", "a.weight.7", "a.experts.9"]
    for name in NAMES + odd:
        layer = LAYER.search(name)
        expert = MEGATRON_EXPERT.search(name)
        want_expert = -1 if expert is None else int(expert.group(1) or expert.group(2))
        want_layer = -1 if layer is None else int(layer.group(2))
        assert _parse(name, experts) == (want_layer, want_expert, _hidden(name, experts))
