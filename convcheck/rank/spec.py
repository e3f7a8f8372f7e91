"""What a rank needs to build its model (pure data: the Job builds it on the launcher side, each rank reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from convcheck.layout import ParallelLayout
from convcheck.rank.options import ReshardTargets, SyncOptions


@dataclass(frozen=True, kw_only=True, slots=True)
class RankSpec:
    """What a rank needs to build its model: checkpoint, layout, device and the expert layout."""

    model_path: str
    layout: ParallelLayout
    device: str = "cpu"
    timeout_s: float = 600.0
    experts: str = "auto"
    """MoE expert layout: "auto" (what the provider asks for), "sequential" or "te-grouped"."""
    spec: str = "te"
    """Layer specs: "te" (the bridge's Transformer Engine specs, on convcheck's stand-in without TE) or "local"."""
    write_manifest: str | None = None
    progress_file: str | None = None
    """Rank 0 appends progress events here (None: silent)."""
    sync: SyncOptions = SyncOptions()
    pad_vocab: int | None = None
    """Build the padded vocabulary: make_vocab_size_divisible_by=N, should_pad_vocab=True (None: the HF vocab)."""
    checkpoint_dir: str | None = None
    """distckpt oracle: the torch_dist folder to save into (first launch) or to resume from (`resuming`)."""
    resuming: bool = False
    """A resume job: the model is built but not loaded from the HF checkpoint."""
    targets: ReshardTargets = ReshardTargets()
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The run's oracle-owned options ({oracle: {key: value}})."""
    workdir: str | None = None
    """The job folder."""
