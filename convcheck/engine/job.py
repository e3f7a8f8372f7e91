"""The job one `convcheck verify` hands to its ranks, and the result files they hand back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from convcheck.engine.nodes import Nodes
from convcheck.layout import ParallelLayout
from convcheck.oracles import option_args, stored_options
from convcheck.rank.options import ReshardTargets, SyncOptions
from convcheck.rank.spec import RankSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """Everything a rank needs to run the oracles for one (model, layout)."""

    model_path: str
    """Folder of the HF checkpoint."""
    model_label: str
    """What the user asked for (a path, tiny:<name> or config:FILE)."""
    layers: int | None = None
    """The layer count asked of a config:FILE model (None: the shrinker's default)."""
    layout: ParallelLayout
    device: str = "cpu"
    """The device the ranks use ("cpu" or "cuda"), already decided (see convcheck.device)."""
    device_reason: str = ""
    """Why: what was requested and, for auto, what was visible."""
    device_requested: str = "auto"
    """What `--device` asked for (auto, cpu, cuda): the replay line repeats it, not what auto decided."""
    oracles: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    """`module:function` or `file.py:function` callables run in every rank before the model is built."""
    workdir: str = "."
    """Folder for the job file, per-rank error files and the result."""
    timeout_s: float = 600.0
    experts: str = "auto"
    """MoE expert layout: "auto" (what the provider asks for), "sequential" (SequentialMLP) or "te-grouped"
    (TEGroupedMLP's parameters)."""
    spec: str = "te"
    """Layer specs: "te" (the bridge's TE specs, on convcheck's TE stand-in without TE) or "local" (megatron-core's
    local spec)."""
    write_manifest: str | None = None
    """Set only in the reference job: where the layout oracle writes its export digests."""
    rank_function: str | None = None
    """`MODULE:FUNC` / `FILE.py:FUNC` called as FUNC(ctx, **kwargs) in every rank instead of the oracles."""
    rank_kwargs_file: str | None = None
    """Pickle of the keyword arguments for `rank_function` (None: no arguments)."""
    sync: SyncOptions = SyncOptions()
    """The weight-sync path under test (sender, receiver, chunk size)."""
    pad_vocab: int | None = None
    """Padded vocabulary: the provider's make_vocab_size_divisible_by=N and should_pad_vocab=True (None: off)."""
    manifest_out: str | None = None
    """Where rank 0 writes the case's gate manifest (convcheck.gate.manifest) after the oracles ran (None: not)."""
    checkpoint_dir: str | None = None
    """distckpt oracle: the torch_dist folder the engine owns; the first launch saves into it, a resume job loads it."""
    resume_layouts: tuple[ParallelLayout, ...] = ()
    """distckpt oracle: the layouts the engine resumes the checkpoint at, one launch each after the first."""
    targets: ReshardTargets = ReshardTargets()
    """Reshard oracle: the target sizes, every combination checked in this one launch."""
    resuming: bool = False
    """Set only in a resume job: the model is built but not loaded from the HF checkpoint (`checkpoint_dir` is)."""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The oracle-owned options given ({oracle: {key: value}}, convcheck.oracles.collect_options): each oracle reads its
    own (RankContext.oracle_options), the replay line repeats them (OracleOption.replay)."""
    nodes: Nodes | None = None
    """The run spans hosts: this launcher's node and where the nodes meet (None: one host, torchrun --standalone)."""

    def agreed(self) -> dict[str, Any]:
        """What every node of a multi-node run must have been asked alike (paths and the node's own rank aside)."""
        data = self._plain()
        for own in ("workdir", "model_path", "checkpoint_dir", "rank_kwargs_file"):
            data.pop(own, None)
        data["manifest_out"] = bool(data["manifest_out"])  # every rank records it alike; the path is each node's own
        if data.get("nodes"):
            data["nodes"] = {k: v for k, v in data["nodes"].items() if k != "node_rank"}
        return data

    def _plain(self) -> dict[str, Any]:
        data = asdict(self)
        data["layout"] = self.layout.to_dict()
        data["resume_layouts"] = [layout.to_dict() for layout in self.resume_layouts]
        return data

    def replay_args(self, oracles: Sequence[str] | None = None) -> list[str]:
        """`convcheck verify` arguments that rerun this job, with only `oracles` when given (defaults left out)."""
        oracles = list(self.oracles if oracles is None else oracles)
        args = ["--model", self.model_label]
        if self.layers is not None:
            args += ["--layers", str(self.layers)]
        args += self.layout.cli_args()
        if self.device_requested != "auto":
            args += ["--device", self.device_requested]
        if self.experts != "auto":
            args += ["--experts", self.experts]
        if self.spec != "te":
            args += ["--spec", self.spec]
        if self.pad_vocab is not None:
            args += ["--pad-vocab", str(self.pad_vocab)]
        args += ["--oracle", ",".join(oracles)]
        args += [a for hook in self.hooks for a in ("--hook", hook)]
        if "distckpt" in oracles:
            args += [a for resume in self.resume_layouts for a in ("--resume-layout", resume.spec)]
        if "reshard" in oracles:
            for flag, sizes in (("--target-tp", self.targets.tps), ("--target-ep", self.targets.eps),
                                ("--target-etp", self.targets.etps)):  # fmt: skip
                if tuple(sizes) != (1,):
                    args += [a for size in sizes for a in (flag, str(size))]
        args += option_args(self.options, oracles)
        if self.sync.sender is not None:
            args += ["--sender", self.sync.sender]
        if self.sync.receiver is not None:
            args += ["--receiver", self.sync.receiver]
        if self.sync.chunk_mb != 64.0:
            args += ["--chunk-mb", f"{self.sync.chunk_mb:g}"]
        return args

    def rank_spec(self) -> RankSpec:
        """What each rank needs to bring up its model."""
        return RankSpec(
            model_path=self.model_path,
            layout=self.layout,
            device=self.device,
            timeout_s=self.timeout_s,
            experts=self.experts,
            spec=self.spec,
            write_manifest=self.write_manifest,
            progress_file=str(self.progress_file),
            sync=self.sync,
            pad_vocab=self.pad_vocab,
            checkpoint_dir=self.checkpoint_dir,
            resuming=self.resuming,
            targets=self.targets,
            options=self.options,
            workdir=self.workdir,
        )

    @property
    def result_file(self) -> Path:
        return Path(self.workdir) / "result.json"

    @property
    def partial_file(self) -> Path:
        """Rank 0's verdicts so far, rewritten after each oracle (what a run stopped midway still reports)."""
        return Path(self.workdir) / "partial.json"

    @property
    def progress_file(self) -> Path:
        """Where rank 0 appends progress events (convcheck.progress)."""
        return Path(self.workdir) / "progress.jsonl"

    @property
    def value_file(self) -> Path:
        """Where rank 0 pickles the return value of `rank_function`."""
        return Path(self.workdir) / "value.pkl"

    def error_file(self, rank: int) -> Path:
        return Path(self.workdir) / f"rank{rank}.error.json"

    def save(self) -> Path:
        path = Path(self.workdir) / "job.json"
        path.write_text(json.dumps(self._plain(), indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Job":
        data = json.loads(Path(path).read_text())
        data["layout"] = ParallelLayout.from_dict(data["layout"])
        data["oracles"] = tuple(data["oracles"])
        data["hooks"] = tuple(data["hooks"])
        data["resume_layouts"] = tuple(ParallelLayout.from_dict(d) for d in data.get("resume_layouts", ()))
        data["sync"] = SyncOptions(**data["sync"])
        data["targets"] = ReshardTargets.from_dict(data["targets"])
        data["options"] = stored_options(data.get("options", {}))
        data["nodes"] = Nodes(**data["nodes"]) if data.get("nodes") else None
        return cls(**data)
