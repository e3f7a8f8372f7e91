"""CPU runs call upstream's torch.compile'd functions eagerly (megatron-core's `jit_fuser`: activations, norms, the
MoE router, GatedDeltaNet's gating): inductor's CPU code generation compiles C++ for every graph, 12-20 s of a tiny
hybrid model's forward per launch even with its cache warm (NemotronH's logits 20 s compiled, 0.3 s eager), for the
same math on a few tokens. CUDA runs compile as upstream does.

FlexAttention (the bridge's Gemma 2 core attention, gemma2_provider.py:65) compiles its own higher-order op even when
called uncompiled (torch/nn/attention/flex_attention.py, `torch.compile(_flex_attention_hop_wrapper, fullgraph=True)`),
which fails with dynamo disabled; the eager mode calls that op directly instead (torch's
`_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG`: its dense reference implementation, the same forward math)."""

from __future__ import annotations

import torch._dynamo
import torch.nn.attention.flex_attention as flex

_saved: dict[str, bool] = {}


def run_compiled_eagerly(on: bool) -> None:
    """On: every torch.compile'd function runs as plain Python (torch._dynamo disabled at call time, so functions
    decorated at import time follow too). Off: dynamo as it was before the first `on`."""
    if on:
        _saved.setdefault("disable", bool(torch._dynamo.config.disable))
        _saved.setdefault("flex", bool(flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG))
        torch._dynamo.config.disable = True
        flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    elif "disable" in _saved:
        torch._dynamo.config.disable = _saved.pop("disable")
        flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = _saved.pop("flex")
