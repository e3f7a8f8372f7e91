"""Planted bugs in the GLM-4.7-Flash bridge's export hook (glm47_flash_bridge.py:116 maybe_modify_converted_hf_weight),
which writes the MTP layers' copies of the embeddings and the output layer after each task's megatron_to_hf.

Both patch the real GLM47FlashBridge class, so the export and the probe (which follows the same hook) see the bug.
"""

from __future__ import annotations

from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.glm.glm47_flash_bridge import GLM47FlashBridge

from convcheck.mutants.patch import wrap

EMBED_ALIAS = ".embed_tokens.weight"
HEAD_ALIAS = ".shared_head.head.weight"


def _wrap_hook(change: Any) -> None:
    """GLM47FlashBridge's hook, then `change(self, converted)` on the dict it returns."""

    def make(original: Any) -> Any:
        def maybe_modify_converted_hf_weight(self, task, converted_weights_dict, hf_state_dict):  # type: ignore[no-untyped-def]
            out = original(self, task, converted_weights_dict, hf_state_dict)
            change(self, out)
            return out

        return maybe_modify_converted_hf_weight

    wrap(GLM47FlashBridge, "maybe_modify_converted_hf_weight", make)


def _mtp_names(bridge: Any, suffix: str) -> list[str]:
    """`model.layers.{L + k}<suffix>` for every MTP depth k of the bridge's HF config."""
    config = bridge.hf_config
    first = config.num_hidden_layers
    return [f"model.layers.{first + k}{suffix}" for k in range(getattr(config, "num_nextn_predict_layers", 0) or 0)]


def mtp_aliases_swapped() -> None:
    """The hook's alias table has its sources swapped: each MTP layer's embed_tokens is a copy of lm_head and its
    shared_head.head a copy of model.embed_tokens (same shape when untied; each still written once)."""

    def change(bridge: Any, out: dict[str, Any]) -> None:
        for source, suffix, other in (
            ("lm_head.weight", EMBED_ALIAS, HEAD_ALIAS),
            ("model.embed_tokens.weight", HEAD_ALIAS, EMBED_ALIAS),
        ):
            if source in out:
                for name, wrong in zip(_mtp_names(bridge, suffix), _mtp_names(bridge, other)):
                    out.pop(wrong, None)
                    out[name] = out[source].clone()

    _wrap_hook(change)


def mtp_head_alias_dropped() -> None:
    """The hook leaves out the MTP layers' shared_head.head (the export never writes it)."""

    def change(bridge: Any, out: dict[str, Any]) -> None:
        for name in _mtp_names(bridge, HEAD_ALIAS):
            out.pop(name, None)

    _wrap_hook(change)
