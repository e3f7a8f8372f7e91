"""RankContext: what one rank hands to every oracle (bridge, sharded model, source checkpoint, layout)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from convcheck.checkpoint import Checkpoint
from convcheck.layout import ParallelLayout


@dataclass(kw_only=True)
class RankContext:
    """One rank's view of a verify run; oracles are collective: every rank calls them in the same order."""

    rank: int
    world: int
    layout: ParallelLayout
    device: str
    checkpoint: Checkpoint
    bridge: Any
    """The real megatron.bridge AutoBridge for the checkpoint."""
    provider: Any
    model: list[Any]
    """This rank's model chunks, loaded through bridge.load_hf_weights."""
    not_loaded: dict[str, int] = field(default_factory=dict)
    """Global parameter name -> elements still holding the pre-load sentinel on this rank."""

    @property
    def is_reporter(self) -> bool:
        """Rank 0 assembles findings and writes the result."""
        return self.rank == 0

    def export(self) -> Iterator[tuple[str, Any]]:
        """Stream the bridge's HF export (one tensor at a time, CPU); every rank must drain it."""
        yield from self.bridge.export_hf_weights(self.model, cpu=True, show_progress=False)

    def gather(self, obj: Any) -> list[Any]:
        """all_gather_object over the world (a list indexed by rank on every rank)."""
        import torch.distributed as dist

        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def global_name(self, local_name: str, vp_stage: int) -> str:
        """Megatron's global parameter name (layer and expert numbers made global)."""
        from megatron.bridge.models.conversion.model_bridge import _megatron_local_name_to_global

        return _megatron_local_name_to_global(self.model, self.model[0].config, local_name, vp_stage)
