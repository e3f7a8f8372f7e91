"""What exists because mamba_ssm is missing: the Mamba mixer's construction (shim 8) and its scan kernels bound to
convcheck.kernels.mamba (shim 10). Delete this module once megatron-core builds and runs a MambaMixer without it."""

from __future__ import annotations

from typing import Any

from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from convcheck.compat._patch import _patch
from convcheck.compat.detect import optional_module, skip
from convcheck.kernels.mamba import GatedRMSNorm, torch_chunk_scan, torch_split_conv1d_scan


class MixerGatedRMSNorm(GatedRMSNorm):
    """The torch gated RMSNorm with the sharded state dict of upstream's ExtendedRMSNorm (weight split on axis 0)."""

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
        """`weight` sharded along axis 0 over the TP group (what upstream's ExtendedRMSNorm declares)."""
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True), prefix, {"weight": 0}, sharded_offsets,
            tp_group=self.tp_group, dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )  # fmt: skip


# --- Shim 8 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/ssm/mamba_mixer.py:
# - :202 MambaMixer.__init__ raises ImportError when mamba_ssm is missing, and its gated RMSNorm (:417,
#   ExtendedRMSNorm) subclasses mamba_ssm's RMSNormGated (a MagicMock without it, :89-92).
# While mamba_ssm is missing, the constructor runs with HAVE_MAMBA_SSM true and ExtendedRMSNorm bound to
# MixerGatedRMSNorm (same `weight` [d_inner_local], weight sharded on axis 0 as upstream). Its CUDA allocations
# (:326-422) are shim 9's, its CUDA RNG forks (:318, :370) shim 6's (convcheck.compat.no_cuda, CPU runs only).
def install_mamba_mixer_construction() -> None:
    """Install shim 8 (idempotent) while mamba_ssm is missing."""
    mamba_mixer = optional_module("megatron.core.ssm.mamba_mixer")
    if mamba_mixer is None or not hasattr(mamba_mixer, "ExtendedRMSNorm"):
        skip(8, "this megatron-core has no ssm/mamba_mixer.py ExtendedRMSNorm")
        return
    if mamba_mixer.HAVE_MAMBA_SSM:
        return

    def torch_gated_norm(original: Any) -> Any:
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            saved = (mamba_mixer.HAVE_MAMBA_SSM, mamba_mixer.ExtendedRMSNorm)
            mamba_mixer.HAVE_MAMBA_SSM, mamba_mixer.ExtendedRMSNorm = True, MixerGatedRMSNorm
            try:
                return original(self, *args, **kwargs)
            finally:
                mamba_mixer.HAVE_MAMBA_SSM, mamba_mixer.ExtendedRMSNorm = saved

        return __init__

    _patch(mamba_mixer.MambaMixer, "__init__", torch_gated_norm)


# --- Shim 10 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/ssm/mamba_mixer.py:69-79 binds mamba_chunk_scan_combined and
# mamba_split_conv1d_scan_combined to None without mamba_ssm; MambaMixer._ssm_training calls the latter at :755
# (the path of every forward outside inference mode) and _ssm_prefill the former at :1063 (static inference).
# megatron-core 0.16 leaves both names unbound without mamba_ssm (mamba_mixer.py:59-71).
# While mamba_ssm is missing both module names are bound to convcheck.kernels.mamba's torch_split_conv1d_scan /
# torch_chunk_scan: depthwise causal conv1d + SiLU, dt = softplus(dt + dt_bias) (clamped only for a non-default
# dt_limit), the chunked SSD scan in fp32 (exact intra-chunk form, states handed from chunk to chunk), the D skip
# and the SiLU(z) gate, as mamba_ssm's kernels do. Arguments they do not implement (initial states, seq_idx, final
# states, fused norm or out_proj, the non-SSM swiglu part) raise NotImplementedError instead of being ignored.
def install_torch_mamba_scan() -> None:
    """Install shim 10 (idempotent); only while mamba_ssm is missing (its kernels are then None or unbound upstream)."""
    mamba_mixer = optional_module("megatron.core.ssm.mamba_mixer")
    if mamba_mixer is None or not hasattr(mamba_mixer, "MambaMixer"):
        skip(10, "this megatron-core has no ssm/mamba_mixer.py MambaMixer")
        return
    if getattr(mamba_mixer, "mamba_split_conv1d_scan_combined", None) is None:
        mamba_mixer.mamba_split_conv1d_scan_combined = torch_split_conv1d_scan
    if getattr(mamba_mixer, "mamba_chunk_scan_combined", None) is None:
        mamba_mixer.mamba_chunk_scan_combined = torch_chunk_scan


def install() -> None:
    """Install shims 8 and 10 (idempotent; each only while mamba_ssm is missing)."""
    install_mamba_mixer_construction()
    install_torch_mamba_scan()
