"""Padded vocabulary (`verify --pad-vocab N`): megatron-bridge 0.6.2 handles it only half-way, so this module holds
a *candidate fix*, not a planted bug, to check the rest of the stack under padding.

Measured with the real bridge 0.6.2: at TP1 `ColumnParallelMapping.hf_to_megatron` returns the unpadded HF rows
(`param_mapping.py:968`), so the import raises a shape mismatch; at TP>1 the import pads with zero rows
(`:1005`) but `megatron_to_hf` concatenates the shards without removing them (`:1049`), so the export holds the
padding rows. `fix_vocab_padding` pads at TP1 too and trims each vocabulary mapping's export to the HF vocabulary
(the size is handed to the mapping when the bridge builds its conversion tasks: every rank and oracle sees it).
"""

from __future__ import annotations

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
from megatron.bridge.models.conversion.param_mapping import AutoMapping, ColumnParallelMapping

from convcheck.mutants.patch import wrap

VOCAB_PARAMS = ("embedding.word_embeddings.weight", "output_layer.weight")
"""The Megatron parameters whose rows are the (padded) vocabulary."""


def fix_vocab_padding() -> None:
    """Candidate fix: the TP1 import pads the vocabulary rows like TP>1 does; the export drops the padding rows."""
    _patch(short_by=0)


def fix_vocab_padding_trim_too_far() -> None:
    """The candidate fix with a planted bug: the export trims 8 real rows too many (a vocab size without the last
    8 tokens), so the exported embedding / lm_head lose their last 8 rows."""
    _patch(short_by=8)


def _patch(short_by: int) -> None:
    def make_import(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            target = getattr(megatron_module, "weight", None)
            if self.tp_size == 1 and self.megatron_param in VOCAB_PARAMS and target is not None:
                missing = target.shape[0] - hf_weights.shape[0]
                if missing > 0:
                    pad = torch.zeros(
                        (missing, *hf_weights.shape[1:]), dtype=hf_weights.dtype, device=hf_weights.device
                    )
                    hf_weights = torch.cat([hf_weights, pad])
            return original(self, hf_weights, megatron_module)

        return hf_to_megatron

    def make_tasks(original):  # type: ignore[no-untyped-def]
        def build_conversion_tasks(self, hf_pretrained, megatron_model, *args, **kwargs):  # type: ignore[no-untyped-def]
            tasks = original(self, hf_pretrained, megatron_model, *args, **kwargs)
            config = getattr(hf_pretrained, "config", hf_pretrained)
            vocab = (getattr(config, "text_config", None) or config).vocab_size
            for task in tasks:
                if task is not None and task.mapping.megatron_param in VOCAB_PARAMS:
                    task.mapping.vocab_rows = vocab - short_by  # every rank: the export is collective
            return tasks

        return build_conversion_tasks

    def make_export(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            rows = getattr(self, "vocab_rows", None)
            if rows is None:
                return out
            return {name: (t[:rows] if t.shape[0] > rows else t) for name, t in out.items()}

        return megatron_to_hf

    wrap(ColumnParallelMapping, "hf_to_megatron", make_import)
    wrap(MegatronModelBridge, "build_conversion_tasks", make_tasks)
    wrap(ColumnParallelMapping, "megatron_to_hf", make_export)
    wrap(AutoMapping, "megatron_to_hf", make_export)
