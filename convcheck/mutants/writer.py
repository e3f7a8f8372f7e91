"""Planted bugs of the bridge's HF writer: rank hooks that patch the real SafeTensorsStateSource.save_generator (what
AutoBridge.save_hf_pretrained / save_hf_weights write through) the way a broken writer would behave on disk.

Each must be named, file and tensor, by the save oracle (tests/test_save.py, the catalog kill matrix).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import safetensors.torch
import torch
from megatron.bridge import AutoBridge
from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
from megatron.bridge.models.hf_pretrained.state import SafeTensorsStateSource

from convcheck.mutants.patch import wrap

DROPPED_SHARD = "model-00002-of-00003.safetensors"
TIED = ("model.embed_tokens.weight", "lm_head.weight")
MOVED = "model.norm.weight"


def _state_source() -> Any:
    return SafeTensorsStateSource


@contextlib.contextmanager
def _save_file_as(edit: Callable[[dict[str, Any], Path], dict[str, Any] | None]) -> Iterator[None]:
    """While the writer runs, every shard it saves first passes through `edit(tensors, path)` (None: not saved)."""
    original = safetensors.torch.save_file

    def save_file(tensors: dict[str, Any], filename: Any, *args: Any, **kwargs: Any) -> Any:
        kept = edit(dict(tensors), Path(filename))
        if kept is not None:
            return original(kept, filename, *args, **kwargs)
        return None

    safetensors.torch.save_file = save_file
    try:
        yield
    finally:
        safetensors.torch.save_file = original


def _around_writer(edit: Callable[[dict[str, Any], Path], dict[str, Any] | None]) -> None:
    def make(original: Any) -> Any:
        def save_generator(self, generator, output_path, *args, **kwargs):  # type: ignore[no-untyped-def]
            with _save_file_as(edit):
                return original(self, generator, output_path, *args, **kwargs)

        return save_generator

    wrap(_state_source(), "save_generator", make)


def drops_shard() -> None:
    """The writer never puts the source's second shard on disk (the index still lists it)."""
    _around_writer(lambda tensors, path: None if path.name == DROPPED_SHARD else tensors)


def tied_under_other_name() -> None:
    """The tied embedding is written under the source's other tied name only: lm_head.weight, not embed_tokens."""

    def edit(tensors: dict[str, Any], path: Path) -> dict[str, Any]:
        if TIED[0] in tensors:
            tensors[TIED[1]] = tensors.pop(TIED[0])
        return tensors

    _around_writer(edit)


def casts_fp32() -> None:
    """Every fp32 tensor is written as bf16 though no weight_dtype was asked for."""

    def edit(tensors: dict[str, Any], path: Path) -> dict[str, Any]:
        return {n: t.to(torch.bfloat16) if t.dtype == torch.float32 else t for n, t in tensors.items()}

    _around_writer(edit)


def wrong_index_entry() -> None:
    """The written index names the wrong shard for model.norm.weight (the shards themselves are right)."""

    def make(original: Any) -> Any:
        def save_generator(self, generator, output_path, *args, **kwargs):  # type: ignore[no-untyped-def]
            out = original(self, generator, output_path, *args, **kwargs)
            index = Path(output_path) / "model.safetensors.index.json"
            if index.exists():
                data = json.loads(index.read_text())
                files = sorted(set(data["weight_map"].values()))
                here = data["weight_map"].get(MOVED)
                if here is not None and len(files) > 1:
                    data["weight_map"][MOVED] = next(f for f in files if f != here)
                    index.write_text(json.dumps(data, indent=4))
            return out

        return save_generator

    wrap(_state_source(), "save_generator", make)


def stream_renames_norm() -> None:
    """The export stream hands the writer model.norm.weight as `model.norm.scale` (a name the source has not): the
    strict writer raises mid-stream, on rank 0 alone in a rank-0 write."""

    def make(original: Any) -> Any:
        def stream(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            for name, tensor in original(self, *args, **kwargs):
                yield ("model.norm.scale" if name == MOVED else name), tensor

        return stream

    wrap(MegatronModelBridge, "stream_weights_megatron_to_hf", make)


def config_eps_changed() -> None:
    """save_hf_pretrained writes config.json with rms_norm_eps 1e-2 instead of the source's: the weights are right,
    the model transformers loads from the folder is not."""

    def make(original: Any) -> Any:
        def save_hf_pretrained(self, model, path, *args, **kwargs):  # type: ignore[no-untyped-def]
            out = original(self, model, path, *args, **kwargs)
            config = Path(path) / "config.json"
            if config.exists():
                data = json.loads(config.read_text())
                data["rms_norm_eps"] = 1e-2
                config.write_text(json.dumps(data, indent=2))
            return out

        return save_hf_pretrained

    wrap(AutoBridge, "save_hf_pretrained", make)
