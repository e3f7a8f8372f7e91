"""Planted virtual-pipeline and uneven-stage bugs: a chunk's layers numbered with another chunk's offset, the last
stage's tied output layer synced through the wrong chunk, and an uneven split numbered as if it were even. Each
patches the real Megatron-Bridge function the bug would live in."""

from __future__ import annotations

import re
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion import model_bridge
from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
from megatron.core import parallel_state

from convcheck.mutants.patch import wrap


def chunk_offset_from_chunk0() -> None:
    """The bridge's local->global layer numbering gives every VPP chunk chunk 0's layer offset (chunk 1's local layer
    0 becomes the global layer of chunk 0's local layer 0), on import and export alike."""

    def make(original: Any) -> Any:
        def local_to_global(models, config, param_name, vp_stage=None):  # type: ignore[no-untyped-def]
            return original(models, config, param_name, 0 if vp_stage else vp_stage)

        return local_to_global

    wrap(model_bridge, "_megatron_local_name_to_global", make)


def uneven_offset_as_even() -> None:
    """The bridge's local->global layer numbering assumes an even split: a stage's offset is pp_rank x
    (num_layers / pp) instead of the layers the stages before it really hold (wrong after an uneven first stage)."""

    def make(original: Any) -> Any:
        def local_to_global(models, config, param_name, vp_stage=None):  # type: ignore[no-untyped-def]
            name = original(models, config, param_name, vp_stage)
            local = re.match(r"^decoder\.layers\.(\d+)\.", param_name)
            if local is None or config.pipeline_model_parallel_size < 2:
                return name
            stage = parallel_state.get_pipeline_model_parallel_rank()
            even = int(local.group(1)) + stage * (config.num_layers // config.pipeline_model_parallel_size)
            return re.sub(r"^decoder\.layers\.\d+\.", f"decoder.layers.{even}.", name)

        return local_to_global

    wrap(model_bridge, "_megatron_local_name_to_global", make)


def tied_output_from_first_chunk() -> None:
    """The tied-embedding sync after the import writes the last stage's copy of the embeddings into its FIRST VPP
    chunk (a middle chunk without an output layer) instead of its last: the last chunk's output layer keeps what the
    import left in it. The broadcast itself still runs on every rank of the embedding group."""

    def make(original: Any) -> Any:
        def broadcast(self, megatron_model):  # type: ignore[no-untyped-def]
            chunks = megatron_model if isinstance(megatron_model, list) else [megatron_model]
            last = _unwrapped(chunks[-1])
            output = getattr(last, "output_layer", None) if len(chunks) > 1 else None
            kept = output.weight.detach().clone() if output is not None and output.weight is not None else None
            original(self, megatron_model)
            if kept is not None:
                output.weight.data.copy_(kept)  # the copy went to chunk 0, which has no output layer

        return broadcast

    wrap(MegatronModelBridge, "_broadcast_shared_embeddings", make)


def _unwrapped(chunk: Any) -> Any:
    """A model chunk without its DDP / Float16 wrappers."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk
