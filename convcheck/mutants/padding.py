"""Padded vocabulary (`verify --pad-vocab N`): megatron-bridge 0.6.2 handles it only half-way, so this module holds
a *candidate fix*, not a planted bug, to check the rest of the stack under padding.

Measured with the real bridge 0.6.2: at TP1 `ColumnParallelMapping.hf_to_megatron` returns the unpadded HF rows
(`param_mapping.py:968`), so the import raises a shape mismatch; at TP>1 the import pads with zero rows
(`:1005`) but `megatron_to_hf` concatenates the shards without removing them (`:1049`), so the export holds the
padding rows. `fix_vocab_padding` pads at TP1 too and trims the export to the HF vocabulary.
"""

from __future__ import annotations

from convcheck.mutants import wrap

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
    import torch
    from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
    from megatron.bridge.models.conversion.param_mapping import ColumnParallelMapping

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

    def make_export(original):  # type: ignore[no-untyped-def]
        def stream(self, megatron_model, hf_pretrained, *args, **kwargs):  # type: ignore[no-untyped-def]
            config = getattr(hf_pretrained, "config", hf_pretrained)
            vocab = (getattr(config, "text_config", None) or config).vocab_size
            registry = self.mapping_registry()
            mapped = [registry.megatron_to_hf_lookup(p) for p in VOCAB_PARAMS]
            names = {m.hf_param for m in mapped if m is not None and isinstance(m.hf_param, str)}
            for name, tensor in original(self, megatron_model, hf_pretrained, *args, **kwargs):
                yield name, (tensor[: vocab - short_by] if name in names and tensor.shape[0] > vocab else tensor)

        return stream

    wrap(ColumnParallelMapping, "hf_to_megatron", make_import)
    wrap(MegatronModelBridge, "stream_weights_megatron_to_hf", make_export)
