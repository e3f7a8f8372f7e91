"""Mistral (MistralForCausalLM): the Llama-style decoder of `dense.py` with sliding-window attention on every layer.

The bridge (megatron-bridge 0.6.2 mistral/mistral_bridge.py) maps the same tensor names as Llama, so the explicit
mappings are dense.py's; the table differs where the window is: HF `sliding_window` W (every layer, or null for full
attention) is Megatron's `window_size` (W - 1, 0), and the exported config must carry it back.
"""

from __future__ import annotations

from typing import Any

from convcheck.models.architecture import Architecture
from convcheck.models.config_rules import FieldRule, HfView, MegatronGet, implied
from convcheck.models.dense import NO_EXPERTS, NORM_ROPE_ACT, SHAPES
from convcheck.models.fixture_spec import ENGINE_DIMS, tiny_spec
from convcheck.models.upstream_bug import UpstreamBug

MISTRAL_MODELING = "transformers/models/mistral/modeling_mistral.py"


def window_size(c: HfView, _m: MegatronGet) -> Any:
    """Megatron's (left, right) window for HF `sliding_window` W: key j of query i is kept iff i - W < j <= i
    (HF's sliding_window_overlay), which is Megatron's i - left <= j <= i + right with left W - 1, right 0."""
    window = c.get("sliding_window")
    return None if window is None else (int(window) - 1, 0)


def observed_window(value: Any, _m: MegatronGet) -> Any:
    """window_size as a (left, right) tuple (the bridge sets a list), None where attention is full."""
    return None if value is None else tuple(int(v) for v in value)


WINDOW_RULES = (
    FieldRule(
        megatron="window_size",
        hf=("sliding_window",),
        expect=window_size,
        observe=observed_window,
        note=f"HF attends to the last W positions, the query's own included ({MISTRAL_MODELING}:372, masking_utils "
        "sliding_window_overlay); Megatron's window (left, right) keeps i - left <= j <= i + right "
        "(transformer/utils.py:42-49)",
    ),
    implied("window_attn_skip_freq", None, "Mistral applies its window on every layer"),
)

MISTRAL_TABLE = (
    *SHAPES,
    *(rule for rule in NORM_ROPE_ACT if rule.megatron != "window_size"),
    *WINDOW_RULES,
    *NO_EXPERTS,
    implied("add_qkv_bias", False, "Mistral q/k/v projections have no bias"),
    implied("add_bias_linear", False, "Mistral o_proj and MLP have no bias"),
    implied("qk_layernorm", False, "Mistral has no q/k norm"),
)
"""The config oracle's table for model_type mistral."""

WINDOW_OFF_BY_ONE = UpstreamBug(
    name="sliding-window-off-by-one",
    summary="the bridge sets Megatron's window_size to (sliding_window, 0), one position wider than HF's window",
    where="megatron/bridge/models/mistral/mistral_bridge.py:56 (0.3.x: window_size = [sliding_window, 0])",
    findings=(
        ("config", "sliding_window -> window_size", "mismatch"),
        ("logits", "logits", "logits-differ"),
        ("logits", "greedy-tokens", "greedy-differs"),
    ),
    seen_in=("0.3.0", "0.3.1"),
    fixed_in="0.4.0 (#2656, 5fcab34f8: window_size = [sliding_window - 1, 0])",
)
WINDOW_EXPORT_DROPPED = UpstreamBug(
    name="sliding-window-export-dropped",
    summary="the bridge's exported config.json loses sliding_window: Mistral comes back with MistralConfig's default "
    "window 4096 whatever it had (none included)",
    where="megatron/bridge/models/mistral/mistral_bridge.py (0.3.1-0.5.x: no megatron_to_hf_config of its own; the "
    "generic one in conversion/model_bridge.py writes no sliding_window, so the HF class default 4096 comes back)",
    findings=(("config", "sliding_window (megatron_to_hf_config)", "roundtrip-mismatch"),),
    seen_in=("0.3.1", "0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1"),
    fixed_in="0.6.0 (#4800, bf4eaa30a: mcore_to_hf_window_size in megatron_to_hf_config)",
)

MISTRAL = Architecture(
    hf_classes=("MistralForCausalLM",),
    model_type="mistral",
    mapping_rules="convcheck.models.dense_mappings:decoder_rules",
    config_rules=MISTRAL_TABLE,
    fixtures=(
        tiny_spec(
            "mistral",
            "MistralConfig",
            "Mistral, GQA 4q/2kv heads, sliding window 4 on every layer (Mistral-7B-v0.1's structure)",
            sliding_window=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        tiny_spec(
            "mistral-vllm",
            "MistralConfig",
            "tiny:mistral with head_dim 32, which CPU vLLM's attention accepts",
            sliding_window=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            **ENGINE_DIMS,
        ),
        tiny_spec(
            "mistral-nowindow",
            "MistralConfig",
            "Mistral with sliding_window null: full attention, as Mistral-7B-v0.3 (the default rope theta, the only "
            "one transformers 4.57 reads from the config.json transformers 5 writes)",
            sliding_window=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    upstream_bugs=(WINDOW_OFF_BY_ONE, WINDOW_EXPORT_DROPPED),
)
"""Mistral: dense decoder, the window on every layer or none."""
