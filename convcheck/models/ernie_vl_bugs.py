"""Known megatron-bridge bugs of ERNIE 4.5 VL (Ernie4_5_VLMoeForConditionalGeneration), found by `convcheck support`
on the checkpoint transformers writes from its default config (as data; REGISTERED_BUGS lists them)."""

from __future__ import annotations

from convcheck.models.upstream_bug import UpstreamBug

ERNIE45_VL_ROUTER_GATES_BF16 = UpstreamBug(
    name="ernie45-vl-router-gates-bf16",
    summary="transformers keeps ERNIE 4.5 VL's text and vision router gates (gate.weight, gate.weight_1) in float32 "
    "(_keep_in_fp32_modules_strict) and writes them so; the bridge loads each into a megatron-core TopKRouter, "
    "whose weight megatron-core casts to params_dtype (bf16), and exports that: both gates come back bf16-rounded, "
    "dtype bfloat16 where the checkpoint holds float32 (the provider's moe_router_dtype 'fp32' upcasts the routing "
    "compute, not the stored weight; ernie45-router-gate-bf16's twin in the VL bridge)",
    where="megatron/bridge/models/ernie_vl/ernie45_vl_bridge.py:810-822 (the router mappings, no fp32 kept), :496 "
    "(moe_router_dtype); "
    "megatron-core transformer/moe/router.py:81 (the weight cast to params_dtype); transformers models/"
    "ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py:708",
    findings=(
        ("roundtrip", "model.layers.*.mlp.gate.weight", "dtype"),
        ("roundtrip", "model.layers.*.mlp.gate.weight_1", "dtype"),
        ("layout", "model.layers.*.mlp.gate.weight", "tp1-differs-from-source"),
        ("layout", "model.layers.*.mlp.gate.weight_1", "tp1-differs-from-source"),
    ),
    seen_in=("0.5.0", "0.5.1", "0.6.0", "0.6.2"),
)
"""Seen by `convcheck support` at TP2 and EP2 on bridge 0.5.0, 0.5.1, 0.6.0 and 0.6.2 (the router mappings and
megatron-core's cast the same in each; 0.5.1's ernie_vl/ and router.py are byte-identical to 0.5.0's)."""

ERNIE45_VL_BUGS = (ERNIE45_VL_ROUTER_GATES_BF16,)
