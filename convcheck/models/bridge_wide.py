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
    findings=(
        ("roundtrip", "model.layers.*.self_attn.o_proj.weight", "bytes-differ"),
        ("roundtrip", "model.layers.*.mlp.down_proj.weight", "bytes-differ"),
        ("layout", "model.layers.*.self_attn.o_proj.weight", "layout-differs"),
        ("layout", "model.layers.*.mlp.down_proj.weight", "layout-differs"),
    ),
    seen_in=("0.3.0", "0.3.1"),
    fixed_in="0.4.0 (#2794, a235e0314: scatter_to_tp_ranks makes each split contiguous, param_mapping.py:608 in 0.6.2)",
)
"""Seen at TP2 with bridge 0.3.x on tiny:olmoe (o_proj) and tiny:qwen3 (down_proj). The mapping oracle names the same
shards (import-bytes-differ) untagged, and the logits differ: a layer never loaded gives those findings too."""

SEQUENTIAL_EXPERT_EXPORT_FAILS = UpstreamBug(
    name="sequential-expert-export-fails",
    summary="the export of SequentialMLP experts reads the expert number after `.weight` in the Megatron name, "
    "which local_experts.N.linear_fc1.weight does not end with: int('') raises and no expert is exported",
    where="megatron/bridge/models/conversion/param_mapping.py:677 (0.3.1; gather_from_ep_ranks)",
    findings=(
        ("*", "<export>", "export-failed"),
        ("differential", "*.local_experts.*", "probe-failed"),
        ("elements", "*.local_experts.*", "probe-failed"),
    ),
    seen_in=("0.3.0", "0.3.1"),
    fixed_in="0.4.0 (#2358, ba0e490c5: SequentialMLP expert mappings)",
)
"""Seen on tiny:qwen3-moe and tiny:gpt-oss (SequentialMLP experts) with bridge 0.3.x."""

BRIDGE_WIDE: tuple[UpstreamBug, ...] = (ROW_PARALLEL_SCATTER_NON_CONTIGUOUS, SEQUENTIAL_EXPERT_EXPORT_FAILS)
"""Every bridge-wide known bug."""
