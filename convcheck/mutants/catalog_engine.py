"""Catalog entries on the engine path: bugs of a trainer's sync into a real vLLM that only the engine oracle sees.

Each runs alone, with the engine oracle only (`catches=("engine",)`), in the engine's own environment (`make env-vllm`;
without it `convcheck selftest` skips these rows and their clean runs, saying why in one line). Senders
(convcheck.mutants.engine, `via="sender"`) change what the ranks stream; receivers (convcheck.mutants.engine_receivers,
`via="engine-receiver"`) run inside the engine process in place of vLLM's `reload_weights`. The fixtures are the
`-vllm` ones (widths CPU vLLM accepts), at the layouts and with the specs a plain `verify --oracle engine` uses.
"""

from __future__ import annotations

from convcheck.mutants.mutant import HOOKS as _M
from convcheck.mutants.mutant import Mutant

QWEN3_VLLM, LLAMA_VLLM, TIED_VLLM = "tiny:qwen3-vllm", "tiny:llama-vllm", "tiny:llama-tied-vllm"
MOE_VLLM, NEXT_VLLM, DEEPSEEK_VLLM = "tiny:qwen3-moe-vllm", "tiny:qwen3-next-vllm", "tiny:deepseek-v3-vllm"
ENGINE = ("engine",)
OUTPUTS = "<outputs>"
"""The engine oracle's name for a logprobs / greedy-token finding (it names the prompt, position and token)."""


def _engine(**kw: object) -> Mutant:
    """An engine-path entry: the engine oracle catches it, with the specs and experts a plain verify builds."""
    return Mutant(catches=ENGINE, spec="te", experts="auto", **kw)  # type: ignore[arg-type]


ENGINE_MUTANTS: tuple[Mutant, ...] = (
    _engine(
        name="engine_swap_q_k_head",
        description="sender: layer 1's first q head and first k head sent swapped (named in vLLM's packed qkv_proj)",
        hook=_M + "engine:swap_q_k_head",
        via="sender",
        fixture=LLAMA_VLLM,
        layout="tp2",
        targets=("model.layers.1.self_attn.*", OUTPUTS),
    ),
    _engine(
        name="engine_load_weights_directly",
        description="receiver: model.load_weights on the packed CPU engine, skipping vLLM's reload_weights",
        hook=_M + "engine_receivers:load_weights_directly",
        via="engine-receiver",
        engine_packing=True,
        fixture=QWEN3_VLLM,
        layout="tp2",
        targets=("model.*", "<receiver>", OUTPUTS),
    ),
    _engine(
        name="engine_embedding_as_lm_head",
        description="sender: a tied embedding sent only as lm_head.weight (the engine's embedding never updated)",
        hook=_M + "engine:embedding_as_lm_head",
        via="sender",
        fixture=TIED_VLLM,
        layout="tp1",
        targets=("model.embed_tokens.weight", "<sender>", OUTPUTS),
    ),
    _engine(
        name="engine_drop_ep_rank_1_experts",
        description="sender: the routed experts EP rank 1 holds never sent",
        hook=_M + "engine:drop_ep_rank_1_experts",
        via="sender",
        fixture=MOE_VLLM,
        layout="ep2",
        targets=("model.layers.*.mlp.experts.*", OUTPUTS),
    ),
    _engine(
        name="engine_drop_mtp",
        description="sender: the multi-token-prediction layer never sent (only the main model synced)",
        hook=_M + "engine:drop_mtp",
        via="sender",
        fixture=NEXT_VLLM,
        layout="ep2",
        targets=("mtp.*",),
    ),
    _engine(
        name="engine_reload_leaving_a_layer_stale",
        description="receiver: vLLM's reload_weights handed every tensor but layer 1's (that layer keeps the poison)",
        hook=_M + "engine_receivers:reload_leaving_a_layer_stale",
        via="engine-receiver",
        fixture=QWEN3_VLLM,
        layout="tp2",
        targets=("model.layers.1.*", OUTPUTS),
    ),
    _engine(
        name="engine_flip_mla_elements",
        description="sender: element [1, 2] of layer 0's kv_a_proj_with_mqa and layer 1's kv_b_proj sign-flipped",
        hook=_M + "engine:flip_mla_elements",
        via="sender",
        fixture=DEEPSEEK_VLLM,
        layout="tp2",
        targets=("model.layers.[01].self_attn.*", OUTPUTS),
    ),
    _engine(
        name="engine_reload_dropping_a_delta_tensor",
        description="receiver: the delta sync of a planted update loses its first changed tensor",
        hook=_M + "engine_receivers:reload_dropping_a_delta_tensor",
        via="engine-receiver",
        fixture=QWEN3_VLLM,
        layout="tp2",
        targets=("model.layers.0.*", "model.layers.1.*", OUTPUTS),
        options=(("engine_delta", "on"),),
    ),
)
"""The engine-path mutants, in the order the kill matrix lists them."""
