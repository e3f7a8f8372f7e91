"""What exists because Transformer Engine is missing, for the OLMoE bridge: its own layer spec (the full-width q/k norm
attention) built on megatron-core's local backend (shim 24). Delete this module once the bridge builds OLMoE without
TE."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.gpt_provider import local_layer_spec

from convcheck.compat._patch import _patch
from convcheck.compat.detect import optional_module, skip, te_free

OLMOE_PROVIDER = "megatron.bridge.models.olmoe.olmoe_provider"
SHIM_24 = "olmoe-layer-spec-te"

# --- Shim 24 ----------------------------------------------------------------------------------------
# megatron-bridge 0.6.2, models/olmoe/olmoe_provider.py:43: olmoe_layer_spec starts from default_layer_spec(config),
# the TE layer spec, which fails without TE (megatron-core gpt_layer_specs.py:233, 'NoneType' object is not
# callable); replacing the whole spec by local_layer_spec (what convcheck does for the other GPT bridges) would drop
# the bridge's OLMoESelfAttention (:44), whose q/k norms span every head. While TE is missing, the name
# default_layer_spec in that module gives the bridge's own TE-free local_layer_spec, so the bridge's
# olmoe_layer_spec still puts its OLMoESelfAttention on it; configure_provider keeps that spec.


def _local_base(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def default_layer_spec(config: Any) -> Any:
        if not te_free():
            return original(config)

        return local_layer_spec(config)

    return default_layer_spec


def install() -> None:
    """Shim 24 where the installed bridge has an OLMoE provider built on default_layer_spec (idempotent)."""
    module = optional_module(OLMOE_PROVIDER)
    if module is None or not hasattr(module, "default_layer_spec"):
        skip(24, f"{OLMOE_PROVIDER}.default_layer_spec is absent in this release")
        return
    _patch(module, "default_layer_spec", _local_base, name=SHIM_24)


def is_olmoe_layer_spec(spec: Any) -> bool:
    """True for the bridge's olmoe_layer_spec (kept on the TE-free path: shim 24 gives it a local base spec)."""
    module = optional_module(OLMOE_PROVIDER)
    return module is not None and spec is getattr(module, "olmoe_layer_spec", None)
