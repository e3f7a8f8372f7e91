"""convcheck.probe.hook: the probe follows the bridge's real export hook (maybe_modify_converted_hf_weight) on copies,
and a hook output that is not made of the task's shard is named, not decoded."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from convcheck.probe.hook import export_hook
from convcheck.probe.run import CodeCache, probe_task
from convcheck.probe.runs import hf_ranges
from convcheck.probe.stubs import ProbeCommError

EMBED, EMBED_ALIAS, HEAD_ALIAS = (
    "model.embed_tokens.weight",
    "model.layers.4.embed_tokens.weight",
    ("model.layers.4.shared_head.head.weight"),
)


@pytest.fixture(autouse=True)
def _shims() -> None:
    from convcheck import compat

    compat.install_import_shims()  # megatron.bridge without Transformer Engine


def _auto_bridge(fixture: str) -> Any:
    from megatron.bridge import AutoBridge

    from convcheck.fixtures.build import build_fixture

    return AutoBridge.from_hf_pretrained(str(build_fixture(fixture)))


class Rows:
    """Export-side mapping of a local kind: the shard is HF tensor `name`, unchanged."""

    def __init__(self, name: str) -> None:
        self.name = name

    def megatron_to_hf(self, weights: torch.Tensor, module: object) -> dict[str, torch.Tensor]:
        return {self.name: weights}


@dataclass(frozen=True)
class Task:
    param_name: str
    global_param_name: str
    mapping: Any
    param_weight: Any
    megatron_module: Any = None


def test_the_glm_hook_is_followed_on_copies_without_touching_the_export_side() -> None:
    auto = _auto_bridge("tiny:glm4.7-flash")
    before = dict(vars(auto))
    follow = export_hook(SimpleNamespace(bridge=auto))
    assert follow is not None
    embed = torch.arange(152 * 32, dtype=torch.int32).reshape(152, 32)
    outputs = {EMBED: embed}
    got = follow(Task("embedding.word_embeddings.weight", "embedding.word_embeddings.weight", None, None), outputs)
    assert sorted(got) == [EMBED, EMBED_ALIAS] and got[EMBED] is embed
    assert torch.equal(got[EMBED_ALIAS], embed) and got[EMBED_ALIAS].data_ptr() != embed.data_ptr()
    assert outputs == {EMBED: embed}  # the caller's dict is not the one the hook filled
    assert vars(auto) == before  # nothing set on the AutoBridge the export uses


def test_no_hook_where_the_bridge_keeps_the_base_one_or_is_not_an_auto_bridge() -> None:
    assert export_hook(SimpleNamespace(bridge=_auto_bridge("tiny:qwen3"))) is None
    assert export_hook(SimpleNamespace(bridge=SimpleNamespace(get_conversion_tasks=list))) is None


def test_probe_slots_of_the_hooks_copies_are_those_of_their_source() -> None:
    follow = export_hook(SimpleNamespace(bridge=_auto_bridge("tiny:glm4.7-flash")))
    weight = torch.zeros(152, 32, dtype=torch.bfloat16)
    slots = probe_task(Task("embedding", "embedding.word_embeddings.weight", Rows(EMBED), weight), 0, CodeCache(),
                       follow)  # fmt: skip
    assert sorted(slots) == [EMBED, EMBED_ALIAS]
    assert hf_ranges(slots[EMBED_ALIAS].runs) == hf_ranges(slots[EMBED].runs) == [(0, 152 * 32)]
    head = probe_task(Task("output", "output_layer.weight", Rows("lm_head.weight"), weight), 0, CodeCache(), follow)
    assert sorted(head) == ["lm_head.weight", HEAD_ALIAS]


def test_a_hook_output_computed_from_elsewhere_is_named_as_the_hooks() -> None:
    """A hook that adds a tensor not made of the shard (here a float copy) cannot be decoded: the error says so."""

    def computed(task: Any, outputs: dict[str, Any]) -> dict[str, Any]:
        return {**outputs, "extra.inv_freq": torch.ones(4)}

    weight = torch.zeros(4, 3, dtype=torch.bfloat16)
    with pytest.raises(ProbeCommError, match=r"^extra.inv_freq, made by the bridge's maybe_modify_converted_hf_weight"):
        probe_task(Task("p", "p", Rows("hf"), weight), 0, CodeCache(), computed)
