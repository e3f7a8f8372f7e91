"""The Gemma 4 text bridge of megatron-bridge 0.5.0 / 0.5.1 (MoE-only: gemma/gemma4_bridge.py, gemma4_provider.py,
identical in both releases, with megatron-core 0.18): the bugs convcheck names there, as data (no torch). 0.6.0 rewrote
the bridge (a dense provider, the MoE layer of gemma/modeling_gemma4.py, its own config export)."""

from __future__ import annotations

from convcheck.models.upstream_bug import UpstreamBug

RELEASES_05 = ("0.5.0", "0.5.1")
"""Releases whose Gemma 4 bridge is the MoE-only one (gemma4_bridge.py / gemma4_provider.py identical in both)."""

DENSE_BUILT_AS_MOE = UpstreamBug(
    name="gemma4-dense-built-as-moe",
    summary="the Gemma 4 bridge builds every Gemma4ForCausalLM as the MoE variant: a dense config (enable_moe_block "
    "false: E2B / E4B / 31B) gets Gemma4ModelProvider's MoE defaults (128 experts of width 704 beside a 2112-wide "
    "shared expert) and no per-layer input embeddings, where the VL bridge refuses a dense config with per-layer "
    "inputs; the import raises on the shapes and nothing of the checkpoint converts",
    where="megatron/bridge/models/gemma/gemma4_bridge.py:121-181 (provider_bridge; its docstring :32-36 says dense "
    "models are not supported); gemma4_provider.py:110-113 (the MoE defaults); the refusal the text bridge lacks: "
    "gemma_vl/gemma4_vl_bridge.py:78-86",
    findings=(
        ("*", "<import>", "import-failed"),
        ("coverage", "*", "hf-missing"),
        ("coverage", "*", "not-loaded"),
        ("coverage", "*", "not-exported"),
        ("coverage", "*", "unexpected"),
        ("roundtrip", "*", "missing"),
        ("roundtrip", "*", "unexpected"),
        ("roundtrip", "*", "shape"),
        ("roundtrip", "*", "bytes-differ"),
        ("config", "*", "mismatch"),
        ("config", "*", "roundtrip-mismatch"),
        ("logits", "*", "logits-differ"),
        ("logits", "*", "greedy-differs"),
        ("elements", "*", "never-written"),
        ("elements", "*", "shape"),
        ("elements", "*", "unexpected"),
        ("layout", "*", "missing"),
        ("layout", "*", "tp1-differs-from-source"),
        ("mapping", "*", "no-mappings"),
    ),
    seen_in=RELEASES_05,
    fixed_in="0.6.0 (Gemma4DenseProvider for enable_moe_block false, gemma4_bridge.py:54)",
    config_holds=(("enable_moe_block", False),),
)
"""Seen on tiny:gemma4 at TP1 (`--spec te`): the import raises on shared_experts.linear_fc1 (its [2 x 2112, H] for the
dense MLP's [2 x 64, H]); every other finding follows from the MoE model built for a dense checkpoint. At TP2
(`convcheck support` on 0.5.1) the same shapes make rank 0's scatter raise (gloo: expected (2112, 64), got (128, 64)),
an import failure every oracle reports."""

_MOE_NORMS_AND_SCALES = (
    "model.layers.*.post_feedforward_layernorm_1.weight",
    "model.layers.*.post_feedforward_layernorm_2.weight",
    "model.layers.*.router.scale",
    "model.layers.*.router.per_expert_scale",
)

MOE_LAYER_UNPATCHED = UpstreamBug(
    name="gemma4-moe-layer-spec-unpatched",
    summary="the Gemma 4 block spec swaps in Gemma4MoELayer and Gemma4TopKRouter only where the MoE layer's spec has a "
    "`module` that is a MoELayer class; the megatron-core it ships with builds that spec as "
    "functools.partial(MoELayer, ...), so every layer is a plain MoELayer with the stock TopKRouter: "
    "post_feedforward_layernorm_1 / _2, router.scale and router.per_expert_scale have nowhere to go (never loaded "
    "nor exported) and the forward lacks those norms and the top-k renormalisation",
    where="megatron/bridge/models/gemma/gemma4_provider.py:408-416 (_gemma4_block_spec, "
    "`isinstance(mlp_spec.module, type)`); megatron-core 0.18 models/gpt/moe_module_specs.py:66 (the partial)",
    findings=tuple(
        (oracle, tensor, kind)
        for oracle, kind in (
            ("coverage", "not-exported"),
            ("roundtrip", "missing"),
            ("elements", "never-written"),
            ("layout", "missing"),
            ("mapping", "uncovered"),
        )
        for tensor in _MOE_NORMS_AND_SCALES
    ),
    consequences=(("logits", "*", "logits-differ"), ("logits", "*", "greedy-differs")),
    seen_in=RELEASES_05,
    fixed_in="0.6.0 (the MoE layer of gemma/modeling_gemma4.py)",
    config_holds=(("enable_moe_block", True),),
)
"""Seen on tiny:gemma4-moe at TP1 (`--spec te`): the built layer 0 is MoELayer / TopKRouter (its spec's mlp a
functools.partial), its parameters hold no Gemma 4 norm past post_ffn_layernorm; the greedy tokens all differ."""

MOE_FUSED_WEIGHTS = UpstreamBug(
    name="gemma4-moe-fused-weights-not-bitwise",
    summary="the Gemma 4 bridge folds router.scale * hidden^-0.5 / pre_feedforward_layernorm_2 into router.proj and "
    "pre_feedforward_layernorm / pre_feedforward_layernorm_2 into the dense MLP's gate / up on import (a float32 "
    "product rounded to bf16) and divides them back out on export: Megatron holds other weights than the checkpoint "
    "(its optimizer then updates the products), and the exported router.proj, gate_proj and up_proj differ from the "
    "source in the last bit",
    where="megatron/bridge/models/gemma/gemma4_bridge.py:283-358 (_fuse_router_weight, _fuse_shared_expert_prenorm, on "
    "import), :209-240 (maybe_modify_converted_hf_weight, the inverse on export)",
    findings=(
        ("roundtrip", "model.layers.*.mlp.[gu][ap]*_proj.weight", "bytes-differ"),
        ("roundtrip", "model.layers.*.router.proj.weight", "bytes-differ"),
        ("layout", "model.layers.*.mlp.[gu][ap]*_proj.weight", "tp1-differs-from-source"),
        ("layout", "model.layers.*.router.proj.weight", "tp1-differs-from-source"),
        ("mapping", "decoder.layers.*.mlp.router.weight", "import-bytes-differ"),
        ("mapping", "decoder.layers.*.mlp.shared_experts.linear_fc1.weight", "import-bytes-differ"),
        ("mapping", "model.layers.*.mlp.[gu][ap]*_proj.weight", "export-bytes-differ"),
        ("mapping", "model.layers.*.router.proj.weight", "export-bytes-differ"),
        ("differential", "decoder.layers.*.mlp.router.weight", "probe-failed"),
        ("differential", "decoder.layers.*.mlp.shared_experts.linear_fc1.weight", "probe-failed"),
        ("elements", "decoder.layers.*.mlp.router.weight", "probe-failed"),
        ("elements", "decoder.layers.*.mlp.shared_experts.linear_fc1.weight", "probe-failed"),
        ("elements", "model.layers.*.mlp.[gu][ap]*_proj.weight", "never-written"),
        ("elements", "model.layers.*.router.proj.weight", "never-written"),
    ),
    seen_in=RELEASES_05,
    fixed_in="0.6.0 (router.scale and the dense MLP's norm kept as their own tensors)",
    config_holds=(("enable_moe_block", True),),
)
"""Seen on tiny:gemma4-moe at TP1: 200 / 2048 elements of gate_proj differ by one bf16 step after the round trip; the
element probes cannot follow a weight the export computes (probe-failed, "placeholders leaked")."""

K_EQ_V_NOT_READ = UpstreamBug(
    name="gemma4-k-eq-v-not-read",
    summary="the Gemma 4 text bridge never sets the provider's attention_k_eq_v (the VL bridge does): the full "
    "layers' V is imported as an untied copy of K, which training updates apart from K, and the export drops it "
    "(v_proj is not in the checkpoint), so the trained V is lost",
    where="megatron/bridge/models/gemma/gemma4_bridge.py:121-181 (provider_bridge), gemma4_provider.py:97 (default "
    "False) and :339-380 (_install_tied_kv ties V to K only when set); gemma_vl/gemma4_vl_bridge.py:111 sets it",
    findings=(("config", "attention_k_eq_v -> attention_k_eq_v", "mismatch"),),
    seen_in=RELEASES_05,
    fixed_in="0.6.0",
)

CONFIG_EXPORT_GENERIC = UpstreamBug(
    name="gemma4-config-export-generic",
    summary="the Gemma 4 bridge has no megatron_to_hf_config of its own; the generic one writes none of Gemma 4's "
    "fields (layer_types, sliding_window, the global head width and KV heads, attention_k_eq_v, enable_moe_block and "
    "the experts, final_logit_softcapping, the dual RoPE): an exported config.json describes Gemma4TextConfig's "
    "defaults, not the model converted",
    where="megatron/bridge/models/conversion/model_bridge.py:670-741 (generic megatron_to_hf_config); no override in "
    "gemma/gemma4_bridge.py (0.5.x)",
    findings=(("config", "* (megatron_to_hf_config)", "roundtrip-mismatch"),),
    seen_in=RELEASES_05,
    fixed_in="0.6.0 (Gemma4Bridge.megatron_to_hf_config, gemma4_bridge.py:304)",
)
