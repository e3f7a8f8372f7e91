"""Single tensors of a validated HF checkpoint, loaded as torch tensors (the rank side's reader)."""

from __future__ import annotations

from typing import Any

from safetensors import safe_open

from convcheck.hf.checkpoint import Checkpoint


class TensorReader:
    """Reads single tensors from a checkpoint, keeping at most one shard handle open."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self._file: str | None = None
        self._handle: Any = None

    def get(self, name: str) -> Any:
        """Load tensor `name` (CPU, its stored dtype)."""
        entry = self.checkpoint.tensors[name]
        if entry.file != self._file:
            self._handle = safe_open(str(self.checkpoint.path / entry.file), framework="pt")
            self._file = entry.file
        return self._handle.get_tensor(name)
