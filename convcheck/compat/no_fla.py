"""What exists because flash-linear-attention (fla) is missing: megatron-core's GatedDeltaNet built and run with torch
kernels (shim 19). Delete this module once megatron-core builds and runs a GatedDeltaNet without fla."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from convcheck.compat._patch import _patch
from convcheck.compat.detect import optional_module, skip
from convcheck.kernels.gdn import torch_causal_conv1d, torch_l2norm

GDN_MODULES = (
    "megatron.core.ssm.gated_delta_net.common",  # megatron-core >= 0.19: HAVE_FLA, l2norm, _GDNBase
    "megatron.core.ssm.gated_delta_net.gdn",  # >= 0.19: GatedDeltaNet, its kernel names
    "megatron.core.ssm.gated_delta_net",  # 0.17-0.18: one module
)
"""Where a release keeps GatedDeltaNet and the fla names it binds (None without fla), newest first."""


def _gdn_modules() -> list[ModuleType]:
    """The installed megatron-core's GDN modules that bind fla names (empty when it has no GatedDeltaNet)."""
    found = [optional_module(name) for name in GDN_MODULES]
    return [m for m in found if m is not None and (hasattr(m, "HAVE_FLA") or hasattr(m, "GatedDeltaNet"))]


def defines_gdn(module: ModuleType) -> bool:
    """True for the module that defines GatedDeltaNet itself (0.17-0.18's one module; 0.19's gdn.py binds every
    kernel name it calls, None without fla)."""
    return getattr(getattr(module, "GatedDeltaNet", None), "__module__", None) == module.__name__


# --- Shim 19 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/ssm/gated_delta_net/common.py:
# - :141 _GDNBase.__init__ raises ImportError while fla is missing (HAVE_FLA, bound at :43-54);
# - :43-54 bind causal_conv1d, l2norm and chunk_gated_delta_rule to None without fla; gdn.py:16-25 imports them by
#   name: GatedDeltaNet.forward calls causal_conv1d (gdn.py:205) and chunk_gated_delta_rule (:62, :229) outside
#   deterministic_mode, _prepare_input_for_gated_delta_rule calls l2norm (common.py:413).
# While fla is missing the constructor runs with HAVE_FLA true, and each None-bound name is bound to a torch kernel:
# causal_conv1d and l2norm to convcheck.kernels.gdn's (the conv of the deterministic path, gdn.py:189-199, and fla's
# l2norm formula in fp32), chunk_gated_delta_rule to megatron-core's own torch_chunk_gated_delta_rule (common.py:801,
# what deterministic_mode selects). Its CUDA allocations (common.py:230-314) are shim 9's (CPU runs only).
# megatron-core 0.17-0.18 keep all of it in one module, ssm/gated_delta_net.py, where 0.17 leaves l2norm unbound
# without fla (its `except ImportError` binds only chunk_gated_delta_rule, :39-46) and the forward calls it (:353):
# a name the module that defines GatedDeltaNet leaves unbound is bound like a None one. 0.16 has no GatedDeltaNet.
def install_torch_gdn() -> None:
    """Install shim 19 (idempotent) while fla is missing."""
    modules = _gdn_modules()
    if not modules:
        skip(19, "this megatron-core has no GatedDeltaNet")
        return
    if any(getattr(m, "HAVE_FLA", False) for m in modules):
        return
    rule = next((m.torch_chunk_gated_delta_rule for m in modules if hasattr(m, "torch_chunk_gated_delta_rule")), None)
    kernels = {"causal_conv1d": torch_causal_conv1d, "l2norm": torch_l2norm, "chunk_gated_delta_rule": rule}
    for module in modules:
        for name, kernel in kernels.items():
            if kernel is not None and (
                (name in vars(module) and vars(module)[name] is None)
                or (name not in vars(module) and defines_gdn(module))
            ):
                setattr(module, name, kernel)
    flag_owner = next(m for m in modules if hasattr(m, "HAVE_FLA"))
    gdn_class = next(m.GatedDeltaNet for m in reversed(modules) if hasattr(m, "GatedDeltaNet"))
    constructor_owner = next(
        (c for c in gdn_class.__mro__ if c.__module__ == flag_owner.__name__ and "__init__" in vars(c)), gdn_class
    )

    def with_fla_flag(original: Any) -> Any:
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            saved = flag_owner.HAVE_FLA
            flag_owner.HAVE_FLA = True
            try:
                return original(self, *args, **kwargs)
            finally:
                flag_owner.HAVE_FLA = saved

        return __init__

    _patch(constructor_owner, "__init__", with_fla_flag)


def install() -> None:
    """Install shim 19 (idempotent; only while fla is missing)."""
    install_torch_gdn()
