"""A RankContext made from a running job's own objects: its model chunks, its AutoBridge, its process groups (read
from megatron-core's parallel_state, never created here) and the names its bridge's checkpoint header declares."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convcheck.errors import BadInput
from convcheck.hf.checkpoint import Checkpoint, open_checkpoint
from convcheck.layout import ParallelLayout
from convcheck.rank.context import RankContext
from convcheck.rank.dist import rank_coord
from convcheck.rank.options import SyncOptions

NO_BYTES = "<names only: a live check reads no tensor bytes>"
"""The file every entry of a live run's checkpoint points at: reading a value from it fails loudly."""


def unwrap(chunk: Any) -> Any:
    """The Megatron model inside DDP / Float16Module wrappers (their `.module`)."""
    import torch

    while isinstance(getattr(chunk, "module", None), torch.nn.Module):
        chunk = chunk.module
    return chunk


def chunks_of(model: Any) -> list[Any]:
    """The job's model as a list of unwrapped chunks; BadInput for anything else."""
    import torch

    items = list(model) if isinstance(model, (list, tuple)) else [model]
    if not items or not all(isinstance(c, torch.nn.Module) for c in items):
        raise BadInput("live: model must be a torch module or a non-empty list of model chunks (one per virtual stage)")
    return [unwrap(c) for c in items]


def job_layout(chunks: list[Any]) -> ParallelLayout:
    """The layout of the job's groups, read from megatron-core's parallel_state and the chunks' config."""
    from megatron.core import parallel_state as ps

    config = chunks[0].config
    return ParallelLayout(
        tp=ps.get_tensor_model_parallel_world_size(),
        pp=ps.get_pipeline_model_parallel_world_size(),
        ep=ps.get_expert_model_parallel_world_size(),
        etp=ps.get_expert_tensor_parallel_world_size(),
        vpp=len(chunks),
        pp_first=getattr(config, "num_layers_in_first_pipeline_stage", None),
        pp_last=getattr(config, "num_layers_in_last_pipeline_stage", None),
        pp_embed=bool(getattr(config, "account_for_embedding_in_pipeline_split", False)),
        pp_loss=bool(getattr(config, "account_for_loss_in_pipeline_split", False)),
    )


def names_folder(bridge: Any, names_from: str | Path | None) -> Path | None:
    """The folder whose header names the export's tensors: `names_from`, else the local folder the bridge was built
    from (None when it has neither)."""
    if names_from is not None:
        return Path(names_from)
    path = getattr(getattr(bridge, "hf_pretrained", None), "model_name_or_path", None)
    return Path(path) if path and Path(path).is_dir() else None


def names_only(folder: Path) -> Checkpoint:
    """The folder's config and header (names, shapes, dtypes) with every entry pointing at NO_BYTES."""
    found = open_checkpoint(folder)
    tensors = {name: dataclasses.replace(entry, file=NO_BYTES) for name, entry in found.tensors.items()}
    return Checkpoint(path=found.path, config=found.config, tensors=tensors)


@dataclass(frozen=True, slots=True)
class _PaddedVocab:
    """Stands for a provider where convcheck.rank.shard_match reads the padded vocabulary: padding up to `rows`."""

    rows: int
    tp: int

    @property
    def should_pad_vocab(self) -> bool:
        return True

    @property
    def make_vocab_size_divisible_by(self) -> int:
        return max(1, self.rows // self.tp)


def vocab_shim(chunks: list[Any], layout: ParallelLayout) -> Any:
    """The provider stand-in carrying the embedding rows the job built (None when the chunks do not say)."""
    rows = next((getattr(c, "vocab_size", None) for c in chunks if getattr(c, "vocab_size", None)), None)
    return _PaddedVocab(int(rows), layout.tp) if rows and int(rows) % layout.tp == 0 else None


def live_context(
    model: Any, bridge: Any, *, names_from: str | Path | None, sync: SyncOptions, need_names: bool = True
) -> RankContext:
    """This rank's context over the job's objects; BadInput (on every rank, before any collective) when the job is
    not initialised or the names cannot be found."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if not dist.is_initialized() or not ps.model_parallel_is_initialized():
        raise BadInput("live: call it inside an initialised job (torch.distributed and megatron-core parallel_state)")
    chunks = chunks_of(model)
    folder = names_folder(bridge, names_from)
    if folder is None and need_names:
        raise BadInput(
            "live: the bridge was not built from a local checkpoint folder; pass names_from=FOLDER (its config.json "
            "and safetensors headers name the export's tensors; no tensor bytes are read)"
        )
    checkpoint = names_only(folder) if folder is not None else Checkpoint(path=Path("."), config={}, tensors={})
    layout = job_layout(chunks)
    first = next((p for c in chunks for p in c.parameters()), None)
    device = "cuda" if first is not None and first.is_cuda else "cpu"
    return RankContext(
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        layout=layout,
        coord=rank_coord(),
        device=device,
        checkpoint=checkpoint,
        bridge=bridge,
        provider=vocab_shim(chunks, layout),
        model=chunks,
        sync=sync,
    )
