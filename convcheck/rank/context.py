"""RankContext: what one rank hands to every oracle (bridge, sharded model, source checkpoint, layout)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch.distributed as dist
from megatron.bridge import AutoBridge
from megatron.bridge.models.model_provider import ModelProviderMixin
from megatron.core.transformer.module import MegatronModule

from convcheck.errors import one_line, raised_at
from convcheck.hf.checkpoint import Checkpoint
from convcheck.layout import ParallelLayout, RankCoord
from convcheck.progress import ProgressWriter
from convcheck.rank.dist import parallel_state_group
from convcheck.rank.export_pass import ExportPass
from convcheck.rank.lone import GRACE_S, StageLedger
from convcheck.rank.name_index import LocalTensor, NameIndex
from convcheck.rank.options import ReshardTargets, SyncOptions
from convcheck.sync.stream import sender_failure, sender_stream
from convcheck.verdict import Finding


@dataclass(kw_only=True)
class RankContext:
    """One rank's view of a verify run; oracles are collective: every rank calls them in the same order."""

    rank: int
    world: int
    layout: ParallelLayout
    coord: RankCoord
    """This rank's (tp, ep, etp, pp) coordinates."""
    device: str
    checkpoint: Checkpoint
    bridge: AutoBridge
    """The real megatron.bridge AutoBridge for the checkpoint."""
    provider: ModelProviderMixin
    model: list[MegatronModule]
    """This rank's model chunks, loaded through bridge.load_hf_weights."""
    not_loaded: dict[str, int] = field(default_factory=dict)
    """Global parameter name -> elements still holding the pre-load sentinel on this rank."""
    load_error: str | None = None
    """One line when the bridge's import raised (the model then holds what was written before)."""
    export_error: str | None = None
    """One line when the last export stream raised (it then ends early)."""
    exports: ExportPass = field(default_factory=ExportPass)
    """The run's export pass: the consumers every export stream feeds, and what its drains leave for later oracles."""
    write_manifest: str | None = None
    """Layout oracle in the reference job: write this rank's export digests here instead of comparing."""
    progress: ProgressWriter = field(default_factory=lambda: ProgressWriter(None))
    """Progress events for the launcher (rank 0 writes, other ranks hold a silent writer)."""
    phase: str = ""
    """What the rank is doing now (the running oracle's name), shown with export counts."""
    sync: SyncOptions = SyncOptions()
    """The weight-sync path: the sender `export()` streams, the receiver, the chunk size (convcheck.sync)."""
    sender_issues: list[str] = field(default_factory=list)
    """What the last sender stream yielded that was not (known HF name, tensor): skipped and reported."""
    checkpoint_dir: str | None = None
    """distckpt oracle: the torch_dist folder to save into, or (when `resuming`) to load into the fresh model."""
    resuming: bool = False
    """A resume job: the model was built but not loaded from the HF checkpoint."""
    targets: ReshardTargets = ReshardTargets()
    """Reshard oracle: the target TP, EP and expert-TP sizes."""
    groups: dict[str, Any] | None = None
    """Axis -> process group when the job gave its own (convcheck.live's pg_collection); None: parallel_state's."""
    names_drain_on_device: bool = False
    """Coverage's drain (which reads only names) keeps the export on the weights' device: a live check's taps compare
    there; verify keeps the host copies its taps and digests were measured with."""
    timeout_s: float = 600.0
    """The run's --timeout (an oracle's own process is named as hung well before it)."""
    workdir: str | None = None
    """The job folder (rank logs, result), where an oracle's own process logs go (None: a live check's)."""
    early: dict[str, Any] = field(default_factory=dict)
    """Oracle name -> what its early work started on rank 0 before the model was built (OracleInfo.early)."""
    versions: dict[str, str] = field(default_factory=dict)
    """Versions of what the run's verdicts were made with beyond the rank's own stack (e.g. the engine's vLLM): rank 0
    adds them to the report's versions."""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The run's oracle-owned options ({oracle: {key: value}}, only those given): read through `oracle_options`."""
    stages: StageLedger = field(default_factory=lambda: StageLedger(counts={}))
    """How many bridge stages (import, export streams) this rank has ended: a stage that raised here while a peer
    waits in its collectives ends the run at once (convcheck.rank.lone)."""
    names: NameIndex = field(init=False, repr=False)
    """The global names of this rank's parameters (convcheck.rank.name_index), kept while the chunks live."""

    def __post_init__(self) -> None:
        self.names = NameIndex.of(self.model, self.coord)

    def oracle_options(self, oracle: str) -> dict[str, Any]:
        """The options given to `oracle` ({key: value}; convcheck.oracles.base.option_values adds the defaults)."""
        return self.options.get(oracle, {})

    @property
    def is_reporter(self) -> bool:
        """Rank 0 assembles findings and writes the result."""
        return self.rank == 0

    def export(self, cpu: bool = True) -> Iterator[tuple[str, Any]]:
        """Stream the HF export of the chosen sender (default: the bridge's), one tensor at a time; every rank must
        drain it.

        If the stream raises, it ends and `export_error` says why (oracles report it as a finding); a custom
        sender's bad items are skipped and listed in `sender_issues` (convcheck.sync.stream).
        """
        total = len(self.checkpoint.tensors)
        stream = self.exports.feed(self._stream(cpu), lambda: self.export_error)
        for done, item in enumerate(stream, 1):
            self.progress.emit(self.phase or "export", done=done, total=total, unit="tensors")
            yield item

    def _stream(self, cpu: bool) -> Iterator[tuple[str, Any]]:
        if self.sync.sender is not None:
            yield from sender_stream(self, cpu)
            return
        self.export_error = None
        try:
            yield from self.bridge_export(cpu)
        except Exception as exc:  # noqa: BLE001 - a crashing export is a finding, not a crash of convcheck
            self.export_error = f"{one_line(exc)} at {raised_at(exc)}"
        self.stages.ended("export", self.export_error, grace_s=min(GRACE_S, self.timeout_s / 4))

    def bridge_export(self, cpu: bool = True) -> Iterator[tuple[str, Any]]:
        """The bridge's own `export_hf_weights` stream (what senders build on); raises what the bridge raises."""
        return self.exports.bridge(self, cpu)

    def export_failure(self) -> Finding | None:
        """The `export-failed` (or, for a custom sender, `sender-failed` / `sender-bad-item`) finding for the last
        export stream, or None when it ran to the end cleanly."""
        if self.sync.sender is not None:
            return sender_failure(self)
        if not self.export_error:
            return None
        return Finding(
            tensor="<export>", kind="export-failed", message=f"bridge.export_hf_weights raised {self.export_error}"
        )

    def import_failure(self) -> Finding | None:
        """The `import-failed` finding when the bridge's import raised, else None."""
        if not self.load_error:
            return None
        return Finding(
            tensor="<import>", kind="import-failed", message=f"bridge.load_hf_weights raised {self.load_error}"
        )

    def gather(self, obj: Any) -> list[Any]:
        """all_gather_object over the world (a list indexed by rank on every rank)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def group(self, axis: str) -> Any:
        """This rank's process group along `axis`: "tp", "pp", "ep", "etp", "dp" or "world" (the job's own when it gave
        them, else parallel_state's)."""
        if self.groups is not None and axis in self.groups:
            return self.groups[axis]
        return parallel_state_group(axis)

    def named_parameters(self) -> list[tuple[str, Any]]:
        """(global Megatron name, this rank's shard) for every parameter and persistent buffer of this rank."""
        return [(name, tensor) for _, _, name, tensor in self.local_tensors()]

    def local_tensors(self) -> list[LocalTensor]:
        """(virtual stage, local name, global name, tensor) for every parameter and persistent buffer of this rank,
        walked once per run (coverage, the shard tap and the mapping oracle all ask: convcheck.rank.name_index)."""
        return self.names.local_tensors()

    def mapping_registry(self) -> Any:
        """The registry the bridge converts with: AutoBridge makes a new model bridge per access, and bridges that
        choose mappings by the checkpoint's keys (Qwen3.5's packed experts) read its `hf_pretrained`."""
        family = self.bridge._model_bridge
        family.hf_pretrained = self.bridge.hf_pretrained
        return family.mapping_registry()

    def global_name(self, local_name: str, vp_stage: int) -> str:
        """Megatron's global parameter name (layer and expert numbers made global), computed once per name while the
        model chunks live (coverage, the shard tap and the registry all ask: convcheck.rank.name_index)."""
        return self.names.global_name(local_name, vp_stage)
