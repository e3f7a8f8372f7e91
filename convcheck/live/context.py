"""A RankContext made from a running job's own objects: its model chunks, its AutoBridge, its process groups (its
ProcessGroupCollection when given, else megatron-core's parallel_state; never created here) and the names its
bridge's checkpoint header declares."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from convcheck.errors import BadInput
from convcheck.hf.checkpoint import INDEX_NAME, Checkpoint, open_checkpoint
from convcheck.layout import ParallelLayout
from convcheck.live.groups import job_groups
from convcheck.rank.context import RankContext
from convcheck.rank.options import SyncOptions
from convcheck.sync.agree import agree

NO_BYTES = "<names only: a live check reads no tensor bytes>"
"""The file every entry of a live run's checkpoint points at: reading a value from it fails loudly."""


def unwrap(chunk: Any) -> Any:
    """The Megatron model inside DDP / Float16Module wrappers (their `.module`)."""
    while isinstance(getattr(chunk, "module", None), torch.nn.Module):
        chunk = chunk.module
    return chunk


def chunks_of(model: Any) -> list[Any]:
    """The job's model as a list of unwrapped chunks; BadInput for anything else."""
    items = list(model) if isinstance(model, (list, tuple)) else [model]
    if not items or not all(isinstance(c, torch.nn.Module) for c in items):
        raise BadInput("live: model must be a torch module or a non-empty list of model chunks (one per virtual stage)")
    return [unwrap(c) for c in items]


def names_folder(bridge: Any, names_from: str | Path | None) -> Path | None:
    """The folder whose header names the export's tensors: `names_from`, else the local folder the bridge was built
    from (None when it has neither)."""
    if names_from is not None:
        return Path(names_from)
    path = getattr(getattr(bridge, "hf_pretrained", None), "model_name_or_path", None)
    return Path(path) if path and Path(path).is_dir() else None


_NAMES: dict[str, Checkpoint] = {}
"""names_only's checked results in this process, keyed by names_key (a trainer checks every K steps: the folder's
checks and parsing run once while its config, index and headers stay the same bytes)."""


def names_only(folder: Path) -> Checkpoint:
    """The folder's config and header (names, shapes, dtypes) with every entry pointing at NO_BYTES."""
    key = names_key(folder)
    held = _NAMES.get(key) if key is not None else None
    if held is None:
        found = open_checkpoint(folder)
        tensors = {name: dataclasses.replace(entry, file=NO_BYTES) for name, entry in found.tensors.items()}
        held = Checkpoint(path=found.path, config=found.config, tensors=tensors)
        if key is not None:
            _NAMES.clear()  # one folder per job: the last one kept
            _NAMES[key] = held
    return Checkpoint(path=held.path, config=copy.deepcopy(held.config), tensors=dict(held.tensors))


def names_key(folder: Path) -> str | None:
    """sha256 of what open_checkpoint reads from `folder` for names: the path, config.json, the index and each
    safetensors file's name, size and header bytes (None when any cannot be read: open_checkpoint says why)."""
    digest = hashlib.sha256(str(folder.resolve()).encode())
    try:
        for name in ("config.json", INDEX_NAME):
            part = folder / name
            digest.update(name.encode() + (part.read_bytes() if part.is_file() else b"<absent>"))
        for shard in sorted(folder.rglob("*.safetensors")):
            size = shard.stat().st_size
            with open(shard, "rb") as fh:
                head = fh.read(8)
                header = fh.read(min(int.from_bytes(head, "little"), size)) if len(head) == 8 else b""
            digest.update(f"{shard.relative_to(folder)}:{size}:".encode() + head + header)
    except OSError:
        return None
    return digest.hexdigest()


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
    model: Any,
    bridge: Any,
    *,
    names_from: str | Path | None,
    sync: SyncOptions,
    need_names: bool = True,
    pg_collection: Any = None,
) -> RankContext:
    """This rank's context over the job's objects; BadInput, the same line on every rank (agreed across the world
    before any other collective), when the job is not initialised, its groups disagree or the names cannot be found."""
    if not dist.is_initialized():
        raise BadInput("live: call it inside an initialised job (torch.distributed and megatron-core parallel_state)")
    error, parts = None, None
    try:
        parts = _parts(model, bridge, names_from, need_names, pg_collection)
    except BadInput as exc:
        error = str(exc)
    agreed = agree(error)
    if agreed is not None or parts is None:
        raise BadInput(agreed or error or "live: the job's objects could not be read")
    chunks, checkpoint, groups = parts
    first = next((p for c in chunks for p in c.parameters()), None)
    device = "cuda" if first is not None and first.is_cuda else "cpu"
    return RankContext(
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        layout=groups.layout,
        coord=groups.coord,
        device=device,
        checkpoint=checkpoint,
        bridge=bridge,
        provider=vocab_shim(chunks, groups.layout),
        model=chunks,
        sync=sync,
        groups=groups.groups if pg_collection is not None else None,
        names_drain_on_device=True,
    )


def _parts(model: Any, bridge: Any, names_from: str | Path | None, need_names: bool, pg_collection: Any) -> Any:
    """This rank's chunks, names-only checkpoint and groups; BadInput (this rank's own, not yet agreed)."""
    if not ps.model_parallel_is_initialized():
        raise BadInput(
            "live: megatron-core parallel_state is not initialised; the pinned megatron-bridge's export reads it "
            "(call it inside an initialised job, with or without a pg_collection that agrees with it)"
        )
    chunks = chunks_of(model)
    folder = names_folder(bridge, names_from)
    if folder is None and need_names:
        raise BadInput(
            "live: the bridge was not built from a local checkpoint folder; pass names_from=FOLDER (its config.json "
            "and safetensors headers name the export's tensors; no tensor bytes are read)"
        )
    checkpoint = names_only(folder) if folder is not None else Checkpoint(path=Path("."), config={}, tensors={})
    return chunks, checkpoint, job_groups(chunks, pg_collection)
