"""Every workaround needed to run the real Megatron-Bridge without CUDA, Transformer Engine, mamba_ssm or NCCL: one
module per missing dependency (no_te, no_cuda, no_mamba_ssm, no_nccl) plus provider settings; SHIMS lists them. Each
shim finds its upstream target by feature detection (compat.detect): a release without that target skips it."""

from __future__ import annotations

from dataclasses import dataclass

from convcheck.compat import no_cuda, no_fla, no_mamba_ssm, no_nccl, no_te, no_te_gdn, no_te_olmoe, te_standin
from convcheck.compat._patch import upstream
from convcheck.compat.detect import set_te_free, skipped
from convcheck.compat.eager import run_compiled_eagerly
from convcheck.compat.no_cuda import (
    CPU_CHECKPOINT_SITES,
    CPU_CONSTRUCTOR_SITES,
    CPU_DEVICE_SITES,
    FULL_DIM_QK_NORM,
    GEMMA_CONSTRUCTOR_SITES,
    MROPE_SITES,
    OLDER_CORE_ONLY,
    SINK_SITES,
    YARN_SITES,
)
from convcheck.compat.no_mamba_ssm import MixerGatedRMSNorm
from convcheck.compat.no_te import cpu_hybrid_stack_spec, install_import_shims, transformer_engine_available
from convcheck.compat.provider import (
    CPU_FUSION_FIELDS,
    configure_hybrid_provider,
    configure_provider,
    is_hybrid_provider,
)
from convcheck.compat.te_standin import SPECS, install_te_standin, te_standin_installed
from convcheck.errors import BadInput
from convcheck.kernels.mamba import torch_causal_conv1d, torch_chunk_scan, torch_split_conv1d_scan

TARGET_VERSIONS = {"megatron-core": "0.19.2", "megatron-bridge": "0.6.2"}
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Shim:
    """One workaround: what it makes up for, where upstream needs it, and the test that says when it can go."""

    number: int
    name: str
    missing: str  # "transformer_engine", "cuda", "mamba_ssm" or "fla"
    module: str
    targets: tuple[str, ...]  # upstream file:line in the current pins, relative to site-packages
    test: str  # pytest node id that fails once upstream no longer needs the shim
    seen_in: str = ""  # the releases whose upstream needs it (convcheck/gate/releases.toml; where the target moved)


_TE, _CUDA, _MAMBA = "convcheck.compat.no_te", "convcheck.compat.no_cuda", "convcheck.compat.no_mamba_ssm"
_FLA, _TE_GDN = "convcheck.compat.no_fla", "convcheck.compat.no_te_gdn"
_TE_OLMOE = "convcheck.compat.no_te_olmoe"
_NCCL = "convcheck.compat.no_nccl"
_TE_STANDIN = "convcheck.compat.te_standin"
_CORE = "megatron/core/"
_BRIDGES, _CORES = "megatron-bridge 0.3.0-0.6.2", "megatron-core 0.16.0-0.19.2"
SHIMS = (
    Shim(1, "lora-layers-te-import", "transformer_engine", _TE, ("megatron/bridge/peft/lora_layers.py:20",),
         "tests/test_compat.py::test_shim1_still_needed_lora_layers_imports_transformer_engine",
         _BRIDGES + "; also peft/lora.py:21-22 in 0.3.0-0.5.1"),
    Shim(2, "replicated-mapping-cpu-target", "cuda", _CUDA,
         ("megatron/bridge/models/conversion/param_mapping.py:1297",),
         "tests/test_compat.py::test_shim2_still_needed_replicated_mapping_calls_cuda", _BRIDGES),
    Shim(3, "tied-embedding-cuda-move", "cuda", _CUDA,
         (_CORE + "models/common/language_module/language_module.py:307",),
         "tests/test_compat.py::test_shim3_still_needed_tied_embedding_setup_calls_cuda", _CORES),
    Shim(4, "forward-device-sites", "cuda", _CUDA, tuple(_CORE + where for _, _, where in CPU_DEVICE_SITES),
         "tests/test_compat_forward.py::test_shim4_site_still_targets_cuda_current_device", _CORES),
    Shim(5, "causal-mask-on-cuda", "cuda", _CUDA, (_CORE + "transformer/utils.py:39",),
         "tests/test_compat_forward.py::test_shim5_causal_mask_still_built_on_cuda", _CORES),
    Shim(6, "cuda-rng-fork", "cuda", _CUDA, (_CORE + "transformer/dot_product_attention.py:217",),
         "tests/test_compat_forward.py::test_shim6_attention_dropout_still_forks_cuda_rng", _CORES),
    Shim(7, "hybrid-final-norm-tenorm", "transformer_engine", _TE, (_CORE + "models/hybrid/hybrid_block.py:215",),
         "tests/test_compat_hybrid.py::test_shim7_still_needed_hybrid_final_norm_is_tenorm",
         "megatron-core 0.18.0-0.19.2; 0.16.0-0.17.1 in ssm/mamba_block.py:166-172 (MambaStack)"),
    Shim(8, "mamba-mixer-construction", "mamba_ssm", _MAMBA, (_CORE + "ssm/mamba_mixer.py:202",),
         "tests/test_compat_hybrid.py::test_shim8_still_needed_mamba_mixer_needs_mamba_ssm_and_cuda", _CORES),
    Shim(9, "constructor-buffers-on-cuda", "cuda", _CUDA,
         tuple(_CORE + where for _, _, where in CPU_CONSTRUCTOR_SITES if where not in OLDER_CORE_ONLY),
         "tests/test_compat_hybrid.py::test_shim9_sites_still_allocate_on_cuda", _CORES),
    Shim(10, "torch-mamba-scan", "mamba_ssm", _MAMBA, (_CORE + "ssm/mamba_mixer.py:69",),
         "tests/test_compat_hybrid_forward.py::test_shim10_still_needed_mamba_forward_calls_mamba_ssm_kernels",
         "megatron-core 0.17.0-0.19.2 (kernel names bound to None); 0.16.x (names left unbound)"),
    Shim(11, "checkpoint-preload-cuda-sync", "cuda", _CUDA,
         (_CORE + "dist_checkpointing/strategies/filesystem_async.py:248",),
         "tests/test_distckpt.py::test_shim11_still_needed_checkpoint_preload_synchronizes_cuda", _CORES),
    Shim(12, "checkpoint-finalize-cuda-flag", "cuda", _CUDA,
         tuple(_CORE + where for _, _, where in CPU_CHECKPOINT_SITES),
         "tests/test_distckpt.py::test_shim12_still_needed_checkpoint_finalize_flag_on_cuda", _CORES),
    Shim(13, "torch-adam-step-reshardable", "transformer_engine", _TE,
         (_CORE + "optimizer/distrib_optimizer.py:1219", _CORE + "optimizer/distrib_optimizer.py:2390"),
         "tests/test_distckpt.py::test_shim13_still_needed_reshardable_load_leaves_out_step", _CORES),
    Shim(14, "moe-utils-te-names-unbound", "transformer_engine", _TE, (_CORE + "transformer/moe/moe_utils.py:24",),
         "tests/test_releases.py::test_shim14_still_needed_moe_utils_leaves_te_names_unbound",
         "megatron-core 0.16.0-0.16.1 (0.17+ bind the names to None)"),
    Shim(15, "mla-core-attention-channels", "transformer_engine", _TE,
         (_CORE + "transformer/multi_latent_attention.py:207", _CORE + "transformer/dot_product_attention.py:248"),
         "tests/test_compat_mla.py::test_shim15_still_needed_local_attention_lacks_mla_channels",
         "megatron-core 0.19.2 (older releases not yet checked)"),
    Shim(16, "mtp-block-spec-te", "transformer_engine", _TE,
         ("megatron/bridge/models/gpt_provider.py:371", "megatron/bridge/models/gpt_provider.py:376"),
         "tests/test_compat_mla.py::test_shim16_still_needed_bridge_mtp_spec_asks_for_te",
         "megatron-bridge 0.6.2 (older releases not yet checked)"),
    Shim(17, "mla-q-proj-fused-norm", "transformer_engine", _TE,
         (_CORE + "transformer/mla_qk_norm_config.py:148", _CORE + "transformer/mla_qk_norm_config.py:243"),
         "tests/test_compat_mla.py::test_shim17_still_needed_q_proj_without_lora_needs_a_fused_norm",
         "megatron-core 0.19.2 (older releases not yet checked)"),
    Shim(18, "yarn-rope-on-cuda", "cuda", _CUDA,
         tuple(_CORE + where for _, _, where in YARN_SITES),
         "tests/test_compat_mla.py::test_shim18_still_needed_yarn_rope_allocates_on_cuda",
         "megatron-core 0.19.2 (older releases not yet checked)"),
    Shim(19, "gdn-without-fla", "fla", _FLA,
         (_CORE + "ssm/gated_delta_net/common.py:141", _CORE + "ssm/gated_delta_net/common.py:43",
          _CORE + "ssm/gated_delta_net/gdn.py:205"),
         "tests/test_compat_gdn.py::test_shim19_still_needed_gdn_needs_fla",
         "megatron-core 0.17.0-0.19.2 (0.17-0.18: ssm/gated_delta_net.py)"),
    Shim(20, "experimental-attention-spec-te", "transformer_engine", _TE_GDN,
         (_CORE + "models/gpt/experimental_attention_variant_module_specs.py:442",
          _CORE + "models/gpt/experimental_attention_variant_module_specs.py:474",
          _CORE + "models/gpt/experimental_attention_variant_module_specs.py:73"),
         "tests/test_compat_gdn.py::test_shim20_still_needed_experimental_spec_asserts_te",
         "megatron-core 0.19.2 (older releases not yet checked)"),
    Shim(21, "zero-centered-torch-norm", "transformer_engine", _TE_GDN, (_CORE + "transformer/torch_norm.py:43",),
         "tests/test_compat_gdn.py::test_shim21_still_needed_torch_norm_rejects_zero_centered_gamma", _CORES),
    Shim(22, "sliding-window-mask-on-cuda", "cuda", _CUDA, (_CORE + "transformer/utils.py:44",),
         "tests/test_compat_forward.py::test_shim22_sliding_window_mask_still_built_on_cuda", _CORES),
    Shim(23, "attention-sinks-on-cuda", "cuda", _CUDA, tuple(_CORE + where for _, _, where in SINK_SITES),
         "tests/test_gpt_oss_units.py::test_shim23_still_needed_sinks_allocated_on_cuda",
         "megatron-core 0.19.2 (older releases not yet checked)"),
    Shim(24, "olmoe-layer-spec-te", "transformer_engine", _TE_OLMOE,
         ("megatron/bridge/models/olmoe/olmoe_provider.py:43",),
         "tests/test_olmoe.py::test_shim24_still_needed_olmoe_layer_spec_asks_for_te",
         "megatron-bridge 0.3.0-0.6.2 (tiny:olmoe built with the bridge's attention on 0.3.0, 0.3.1, 0.4.2, 0.5.1, "
         "0.6.0, 0.6.2)"),
    Shim(25, "float8-collectives-over-gloo", "nccl", _NCCL,
         ("megatron/bridge/models/conversion/param_mapping.py:632",
          "megatron/bridge/models/conversion/param_mapping.py:806",
          "megatron/bridge/models/conversion/param_mapping.py:868",
          "megatron/bridge/models/conversion/param_mapping.py:431"),
         "tests/test_compat_gloo.py::test_shim25_still_needed_gloo_refuses_float8",
         "megatron-bridge 0.6.2 with torch 2.14.1's gloo (export_hf_weights_quant; older releases not yet checked)"),
    Shim(26, "te-standin-binding", "transformer_engine", _TE_STANDIN,
         (_CORE + "models/gpt/gpt_layer_specs.py:54", _CORE + "models/gpt/gpt_layer_specs.py:233",
          _CORE + "extensions/transformer_engine_spec_provider.py:8", _CORE + "transformer/transformer_block.py:64",
          _CORE + "models/gpt/experimental_attention_variant_module_specs.py:43",
          _CORE + "extensions/transformer_engine.py:2715"),
         "tests/test_te_standin.py::test_shim26_still_needed_te_layer_spec_has_no_backend_without_te",
         "megatron-core 0.19.2 (older releases not yet checked)"),
    Shim(27, "mrope-on-cuda", "cuda", _CUDA, tuple(where for _, _, where in MROPE_SITES),
         "tests/test_te_families.py::test_shim27_still_needed_mrope_allocates_on_cuda",
         "megatron-core 0.19.2, megatron-bridge 0.6.2 (older releases not yet checked)"),
    Shim(28, "full-dim-qk-norm-mapping-on-cuda", "cuda", _CUDA, (FULL_DIM_QK_NORM[2],),
         "tests/test_te_families.py::test_shim28_still_needed_full_dim_qk_norm_moves_to_cuda",
         "megatron-bridge 0.6.2 (older releases not yet checked)"),
    Shim(29, "gemma-constructors-on-cuda", "cuda", _CUDA, tuple(where for _, _, where in GEMMA_CONSTRUCTOR_SITES),
         "tests/test_te_families.py::test_shim29_still_needed_gemma_constructors_allocate_on_cuda",
         "megatron-bridge 0.6.2 (older releases not yet checked)"),
)  # fmt: skip


def install(device: str = "cpu", spec: str = "local") -> None:
    """Install every shim needed for a run on `device` ("cpu" or "cuda") with the layer specs `spec` ("local" or
    "te"); safe to call more than once (a process installs for one spec).

    The no-CUDA shims are installed and active exactly when `device` is "cpu", whatever the host has; so is the
    eager call of torch.compile'd upstream functions (convcheck.compat.eager). `spec="te"` binds the Transformer
    Engine stand-in (shim 25) and keeps the shims that build TE-free specs (7, 16, 24) from acting.
    """
    if device not in DEVICES:
        raise BadInput(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if spec not in SPECS:
        raise BadInput(f"spec must be one of {', '.join(SPECS)}, got {spec!r}")
    no_te.install()
    no_te_gdn.install()
    no_te_olmoe.install()
    set_te_free(spec == "local")  # a warm server installs for "local" before it forks a rank of either spec
    if spec == "te":
        te_standin.install_te_standin()
    no_mamba_ssm.install()
    no_fla.install()
    no_nccl.install()
    if device == "cpu":
        no_cuda.install()
    else:
        no_cuda.set_active(False)
    run_compiled_eagerly(device == "cpu")


def install_hybrid_shims() -> None:
    """Install the hybrid construction shims that do not depend on the device (7, 8; idempotent)."""
    no_te.install_hybrid_final_norm()
    no_mamba_ssm.install_mamba_mixer_construction()


def install_hybrid_forward_shims() -> None:
    """Install shim 10 (idempotent)."""
    no_mamba_ssm.install_torch_mamba_scan()


def _gated_rms_norm_class() -> type:
    """The gated RMSNorm class shim 8 gives the Mamba mixer (kept for callers of the single-module layout)."""
    return MixerGatedRMSNorm


__all__ = [
    "CPU_CHECKPOINT_SITES",
    "CPU_CONSTRUCTOR_SITES",
    "CPU_DEVICE_SITES",
    "CPU_FUSION_FIELDS",
    "DEVICES",
    "GEMMA_CONSTRUCTOR_SITES",
    "SHIMS",
    "TARGET_VERSIONS",
    "SPECS",
    "Shim",
    "configure_hybrid_provider",
    "configure_provider",
    "cpu_hybrid_stack_spec",
    "install",
    "install_hybrid_forward_shims",
    "install_hybrid_shims",
    "install_import_shims",
    "install_te_standin",
    "is_hybrid_provider",
    "skipped",
    "te_standin_installed",
    "torch_causal_conv1d",
    "torch_chunk_scan",
    "torch_split_conv1d_scan",
    "transformer_engine_available",
    "upstream",
]
