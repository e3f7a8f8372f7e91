"""Known megatron-bridge bugs of the conversion core itself (param_mapping.py, model_bridge.py) that every family
shows where it has the parameters they touch; `convcheck.models.tag_upstream_bugs` reads them beside each family's own.
"""

from __future__ import annotations

from convcheck.models.upstream_bug import UpstreamBug

ROW_PARALLEL_SCATTER_NON_CONTIGUOUS = UpstreamBug(
    name="row-parallel-scatter-non-contiguous",
    summary="the row-parallel import scatters torch.chunk(hf, tp, dim=1) column blocks without making them "
    "contiguous (its .to(dtype) copies nothing when the dtypes agree): at TP2 each rank's o_proj / down_proj shard "
    "holds the wrong elements over gloo (NCCL refuses non-contiguous tensors); import and export differ",
    where="megatron/bridge/models/conversion/param_mapping.py:918 (the chunks) and :500-508 (scatter_to_tp_ranks "
    "without .contiguous()) in 0.3.x",
    findings=tuple(
        (oracle, f"*.{name}.weight", kind)
        for oracle, kind in (("roundtrip", "bytes-differ"), ("layout", "layout-differs"), ("save", "bytes-differ"))
        for name in ("o_proj", "down_proj")
    ),
    consequences=(
        ("mapping", "*.linear_proj.weight", "import-bytes-differ"),
        ("mapping", "*.linear_fc2.weight", "import-bytes-differ"),
        ("layout", "<layout>", "first-differing"),
        ("logits", "logits", "logits-differ"),
        ("logits", "greedy-tokens", "greedy-differs"),
    ),
    seen_in=("0.3.0", "0.3.1"),
    fixed_in="0.4.0 (#2794, a235e0314: scatter_to_tp_ranks makes each split contiguous, param_mapping.py:608 in 0.6.2)",
)
"""Seen at TP2 with bridge 0.3.x on tiny:olmoe (o_proj) and tiny:qwen3 (down_proj), and by `convcheck support` on
every 0.3.x row with a row-parallel linear (the shared experts' down_proj, Gemma 3 VL's language model). The mapping
oracle's shards of the same linears, the first layout-dependent tensor and the logits are its consequences, tagged
only beside its own findings: the 0.3.0 site with each split made contiguous (param_mapping.py:502) passes them."""

EXPORT_RAISES_ON_A_MISSING_TENSOR = UpstreamBug(
    name="export-raises-on-a-tensor-the-checkpoint-lacks",
    summary="build_conversion_tasks skips a mapped HF tensor the checkpoint lacks, then fills its slot 'for pp "
    "communications' with no module; the export's AutoMapping asks the pipeline ranks for the parameter's "
    "parallelism, none has it (at PP1 there is no other rank), and it raises ValueError 'Unknown parallelism type: "
    "None': one tensor missing from the checkpoint stops the whole export",
    where="megatron/bridge/models/conversion/param_mapping.py:1192 (0.4.2; :1170 in 0.4.0 / 0.4.1: "
    "_get_or_create_mapping after megatron_to_hf's broadcast at :1285), model_bridge.py:1494-1509 (the filled task)",
    findings=(
        ("*", "<export>", "export-failed"),
        ("layout", "<export>", "tp1-export-failed"),
        ("differential", "*", "probe-failed"),  # the oracles' own megatron_to_hf calls of that task raise alike
        ("elements", "*", "probe-failed"),
    ),
    message_contains="Unknown parallelism type: None",
    consequences=(
        ("coverage", "*", "not-exported"),
        ("roundtrip", "*", "missing"),
        ("elements", "*", "never-written"),
        ("layout", "*", "missing"),
        ("mapping", "*", "not-exported"),
    ),
    seen_in=("0.4.0", "0.4.1", "0.4.2"),
    fixed_in="0.5.0 (AutoMapping.megatron_to_hf returns nothing when no rank detected a type, "
    "param_mapping.py:1570-1579)",
)
"""Seen by `convcheck support` on NemotronHForCausalLM written by transformers 5.3.0 (its embedding saved under another
name than the bridge maps: transformers-nemotron-h-embedding-saved-singular) with bridge 0.4.0 and 0.4.2 at TP2; the
export's findings (every tensor never exported) follow from the crash."""

SEQUENTIAL_EXPERT_EXPORT_FAILS = UpstreamBug(
    name="sequential-expert-export-fails",
    summary="the export of SequentialMLP experts reads the expert number after `.weight` in the Megatron name, "
    "which local_experts.N.linear_fc1.weight does not end with: int('') raises and no expert is exported",
    where="megatron/bridge/models/conversion/param_mapping.py:677 (0.3.1; gather_from_ep_ranks)",
    findings=(
        ("save", "<writer>", "writer-raised"),  # the writer's own export stream raises the same way
        ("differential", "*.local_experts.*", "probe-failed"),
        ("elements", "*.local_experts.*", "probe-failed"),
    ),
    consequences=(("*", "<export>", "export-failed"),),
    seen_in=("0.3.0", "0.3.1"),
    fixed_in="0.4.0 (#2358, ba0e490c5: SequentialMLP expert mappings)",
)
"""Seen on tiny:qwen3-moe and tiny:gpt-oss (SequentialMLP experts) with bridge 0.3.x."""

WRITER_STRICT_ONLY_WARNS = UpstreamBug(
    name="writer-strict-only-warns",
    summary="save_hf_pretrained / save_hf_weights with strict=True (the default) print 'Error: N tensors from the "
    "original checkpoint were not written' and return normally: every tensor of a source shard the export did not "
    "complete is left out of the folder, and the index's metadata.total_size still counts them",
    where="megatron/bridge/models/hf_pretrained/state.py (SafeTensorsStateSource.save_generator, its final report: "
    "no raise before #4513)",
    findings=(
        ("save", "*.safetensors", "shard-dropped"),
        ("save", "model.safetensors.index.json", "total-size"),
    ),
    seen_in=("0.5.0", "0.5.1"),
    fixed_in="0.6.0 (#4513, b110e96c5: strict mode raises on unsaved keys)",
)
"""Seen on tiny:deepseek-v3 (its MTP shard, which the export leaves incomplete: deepseek-mtp-aliases-dropped) with
the save oracle on bridge 0.5.1; the code is the same in 0.4.x and 0.5.0, whose deepseek export fails earlier."""

QUANT_EXPERT_SCALE_SQUEEZED = UpstreamBug(
    name="quant-expert-scale-squeezed",
    summary="the quantized export reshapes every expert's block scale with .squeeze().unsqueeze(-1) after the EP "
    "gather, even at EP1: a [1, 1] scale grid leaves as [1], [1, C] as [C, 1] and [R, C] as [R, C, 1], so a rollout "
    "reads weight_scale_inv on the wrong grid (the values themselves are the reference's)",
    where="megatron/bridge/models/conversion/param_mapping.py:880 (gather_from_ep_ranks_scale, called at :1092, "
    ":1256, :2801, :2808)",
    findings=(("quant", "*.mlp.experts.*.weight_scale_inv", "scale-shape"),),
    seen_in=("0.6.2",),
)
"""Seen on tiny:qwen3-moe-fp8 (every expert weight one 128x128 block) at TP1, EP2 and TP2xEP2 with bridge 0.6.2."""

QUANT_QKV_SCALE_3D = UpstreamBug(
    name="quant-qkv-scale-3d",
    summary="the quantized export splits the fused QKV scale into q, k and v scales shaped [rows, cols, 1] instead "
    "of the [rows, cols] block grid of each weight",
    where="megatron/bridge/models/conversion/param_mapping.py:3441-3443 (split_qkv_weights_scale)",
    findings=(("quant", "*.self_attn.[qkv]_proj.weight_scale_inv", "scale-shape"),),
    seen_in=("0.6.2",),
)
"""Seen on tiny:qwen3-moe-fp8 at TP1, TP2 and EP2 with bridge 0.6.2."""

QUANT_MAPPING_NOT_IMPLEMENTED = UpstreamBug(
    name="quant-mapping-not-implemented",
    summary="MegatronParamMapping.megatron_to_hf_quant raises NotImplementedError for every mapping class that does "
    "not override it (GDNLinearMapping, GDNConv1dMapping, the Mamba, KV, QKVG, concatenated-QKV and direct "
    "mappings), before asking the quantization checker: the quantized export of a model with such a parameter stops "
    "at its first one, even where nothing there is to be quantized",
    where="megatron/bridge/models/conversion/param_mapping.py:335-344 (the base method), called at "
    "conversion/quant_bridge.py:69",
    findings=(("quant", "<quantized export>", "export-failed"),),
    seen_in=("0.6.2",),
)
"""Seen on tiny:qwen3-next, tiny:qwen3.5, tiny:qwen3.5-moe, tiny:qwen3.6-moe (gated-DeltaNet layers) and
tiny:nemotron-h (Mamba layers) at TP1 and EP2 with bridge 0.6.2; the tensors the export never reached are `missing`
findings that follow from it. Listed by the families it stops (convcheck.models.qwen_next, nemotron_h)."""

QUANT_EXPORT_AUTOGRAD = UpstreamBug(
    name="quant-export-autograd",
    summary="the quantized export runs with autograd on (no @torch.no_grad(), unlike the bf16 export's "
    "stream_weights_megatron_to_hf): quant_fn gets the Megatron parameter itself, which requires grad, so a quant_fn "
    "of plain torch ops builds a graph holding its float32 steps while its tensors live; one that writes in place "
    "(convcheck's reference before it ran under no_grad) kept ~430 MB per export alive on a 1-layer, 8-expert "
    "real-width model, slime's formula none",
    where="megatron/bridge/models/conversion/quant_bridge.py:33 (model_bridge.py:1241 has the decorator); the call at "
    "param_mapping.py:1072, :1235, :2758",
    findings=(("quant", "<quantized export>", "quant-fn-autograd"),),
    seen_in=("0.6.2",),
)
"""Seen on every fixture the quant oracle ran on with bridge 0.6.2 (the oracle's own quant_fn counts the calls and runs
under no_grad)."""

QUANT_GROUPED_EXPORT_NOT_MERGED = UpstreamBug(
    name="quant-grouped-export-not-merged",
    summary="the quantized export has no grouped-export path: for a mapping whose experts share one stacked HF tensor "
    "(is_grouped_export, e.g. GPT-OSS's mlp.experts.gate_up_proj) each expert's slice leaves alone under the stacked "
    "name, once per expert, where the bf16 export merges them into one [experts, ...] tensor",
    where="megatron/bridge/models/conversion/quant_bridge.py:64-95 (no counterpart of model_bridge.py:1361-1374, "
    "_accumulate_grouped_export at :936)",
    findings=tuple(
        ("quant", f"*.mlp.experts.{name}", kind)
        for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
        for kind in ("duplicate", "shape")
    ),
    seen_in=("0.6.2",),
)
"""Seen on tiny:gpt-oss at TP1 and EP2 with bridge 0.6.2 (--quant-block 4)."""

FP8_IMPORT_NOT_DEQUANTIZED = UpstreamBug(
    name="fp8-import-not-dequantized",
    summary="the import of an FP8 block checkpoint (float8_e4m3fn weight + weight_scale_inv) through a bridge that "
    "does not override maybe_modify_loaded_hf_weight casts the float8 values to bf16 and drops their scales, with "
    "one warning ('Dtype mismatch ... Casting', further warnings suppressed): every quantized weight loads off by its "
    "block's scale; only the DeepSeek-V3, DeepSeek-V4, MiniMax-M2 and Ministral3 bridges dequantize",
    where="megatron/bridge/models/conversion/model_bridge.py:881-902 (the base maybe_modify_loaded_hf_weight hands "
    "the float8 tensor on, called at :1108), param_mapping.py:985-993 (ColumnParallelMapping casts it to the "
    "parameter's dtype) and :601, :608 (scatter_to_tp_ranks casts the row-parallel splits)",
    findings=(("quant-import", "*", "loaded-unscaled"),),
    seen_in=("0.6.2",),
)
"""Seen on tiny:qwen3-moe-fp8 at TP1, TP2 and EP2 with bridge 0.6.2 (the Qwen3-MoE bridge has no override);
tiny:deepseek-v3 imports the same layout exactly."""

QUANT_REPLICATED_NOT_QUANTIZED = UpstreamBug(
    name="quant-replicated-not-quantized",
    summary="ReplicatedMapping.megatron_to_hf_quant never asks the quantization checker and sends the weight "
    "unquantized (\"ReplicatedMapping doesn't need quantization\"): in the Transformer Engine layout MLA's q and"
    " kv down projections are duplicated on every TP rank (TELinear, parallel_mode duplicated), so the "
    "quantized export sends q_a_proj and kv_a_proj_with_mqa as bf16 with no weight_scale_inv while the target "
    "(the published DeepSeek-V3 FP8 checkpoint among them) quantizes them",
    where="megatron/bridge/models/conversion/param_mapping.py:1328-1337 (ReplicatedMapping.megatron_to_hf_quant), "
    "reached through AutoMapping.megatron_to_hf_quant (:1613-1633) for a module detected as replicated",
    findings=(
        ("quant", "model.layers.*.self_attn.q_a_proj.weight", "not-quantized"),
        ("quant", "model.layers.*.self_attn.kv_a_proj_with_mqa.weight", "not-quantized"),
    ),
    seen_in=("0.6.2",),
)
"""Seen on tiny:deepseek-v3 at EP2 in the TE layout (verify's default) with bridge 0.6.2; the local layout's MLA down
projections are column-parallel and quantized."""

ROUTER_AUX_LOSS_COEF_UNMAPPED = UpstreamBug(
    name="router-aux-loss-coef-unmapped",
    summary="the 0.3.1-0.4.x conversion core's CONFIG_MAPPING maps aux_loss_alpha to moe_aux_loss_coeff but not "
    "router_aux_loss_coef (the field GPT-OSS, Qwen-MoE, Mixtral and OLMoE configs use): such a model converts with "
    "moe_aux_loss_coeff 0, so training it drops the load-balancing loss the checkpoint was trained with (the forward "
    "and the weights are unaffected)",
    where="megatron/bridge/models/conversion/model_bridge.py:340-380 (0.4.2 CONFIG_MAPPING; :367 maps aux_loss_alpha "
    "only; 0.3.1: :244-300, :271); 0.5.0 adds the pair (model_bridge.py:440)",
    findings=(("config", "*router_aux_loss_coef -> moe_aux_loss_coeff", "mismatch"),),
    seen_in=("0.3.1", "0.4.0", "0.4.1", "0.4.2"),
    fixed_in="0.5.0",
)
"""Seen by `convcheck support` on bridge 0.4.2 (GptOssForCausalLM from transformers 5.3.0's default config,
router_aux_loss_coef 0.9, at TP2 and EP2); CONFIG_MAPPING is the same in 0.4.0 and 0.4.1, and on 0.3.1 (whose GPT-OSS
bridge builds on the generic provider_bridge, gpt_oss_bridge.py:65)."""

BRIDGE_WIDE: tuple[UpstreamBug, ...] = (
    ROW_PARALLEL_SCATTER_NON_CONTIGUOUS,
    SEQUENTIAL_EXPERT_EXPORT_FAILS,
    EXPORT_RAISES_ON_A_MISSING_TENSOR,
    WRITER_STRICT_ONLY_WARNS,
    QUANT_EXPERT_SCALE_SQUEEZED,
    QUANT_QKV_SCALE_3D,
    QUANT_GROUPED_EXPORT_NOT_MERGED,
    QUANT_EXPORT_AUTOGRAD,
    FP8_IMPORT_NOT_DEQUANTIZED,
    QUANT_REPLICATED_NOT_QUANTIZED,
    ROUTER_AUX_LOSS_COEF_UNMAPPED,
)
"""Every bridge-wide known bug."""
