"""The library entry point: `verify(model, layout, ...) -> Report`, what the CLI, benches and plugin all call."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from convcheck.causes import explain
from convcheck.device import choose_device, visible_gpu_count
from convcheck.engine.job import Job
from convcheck.engine.launch import run_ranks
from convcheck.engine.nodes import Nodes, check_across_nodes
from convcheck.engine.place import torchrun_place
from convcheck.engine.reference import attribute_layout
from convcheck.engine.resume import checkpoint_folder, run_resumes
from convcheck.errors import BadInput
from convcheck.fixtures import get_spec
from convcheck.fixtures.folders import config_folder, tiny_folder
from convcheck.fixtures.specs import CONFIG_PREFIX
from convcheck.gate.manifest import build_manifest, check_manifest_path, write_manifest
from convcheck.hf.checkpoint import architecture_of, config_of, open_checkpoint
from convcheck.hf.geometry import Geometry
from convcheck.hooks import parse_hook
from convcheck.layout import ParallelLayout
from convcheck.models import tag_upstream_bugs
from convcheck.models.te_only import layer_spec_for
from convcheck.oracles import collect_options, parse_oracle_names
from convcheck.progress import ProgressSink
from convcheck.rank.options import ReshardTargets, SyncOptions
from convcheck.rollout.environment import SET_ENV, check_python
from convcheck.sync.adapters import ENGINE_RECEIVER, check_adapters, normalize_sender
from convcheck.verdict import OracleVerdict, Report, complete

EXPERT_LAYOUTS = ("auto", "sequential", "te-grouped")
"""`--experts`: what the bridge's provider asks for (auto: TEGroupedMLP where it sets moe_grouped_gemm, with the TE
specs), or SequentialMLP, or TEGroupedMLP's parameters, whatever the provider says."""
LAYER_SPECS = ("te", "local")
"""`--spec`: the Transformer Engine specs production trains with (default; built on convcheck's TE stand-in where TE
is missing, convcheck.compat.te_standin), or megatron-core's local layer spec."""


def resolve_model(model: str, layers: int | None = None) -> str:
    """A checkpoint folder for `model`: a path, a built-in fixture `tiny:<name>`, or `config:FILE`, a config.json
    shrunk to a tiny fixture of `layers` layers (default: the fewest that keep its layer pattern); built once."""
    if model.startswith(CONFIG_PREFIX):
        folder, _, _ = config_folder(model.removeprefix(CONFIG_PREFIX), layers)
        return str(folder)
    if layers is not None:
        raise BadInput(f"--layers applies only to a --model {CONFIG_PREFIX}FILE fixture, not {model}")
    if model.startswith("tiny:"):
        get_spec(model)
        return str(tiny_folder(model))
    return model


def as_layout(layout: ParallelLayout | str | None) -> ParallelLayout:
    """A ParallelLayout from a layout, its spelling ("tp2ep2") or None (TP1)."""
    if layout is None:
        return ParallelLayout()
    return layout if isinstance(layout, ParallelLayout) else ParallelLayout.parse(layout)


def as_oracles(oracles: Sequence[str] | str | None, experts: str = "auto") -> tuple[str, ...]:
    """Validated oracle names (all by default); every expert layout runs every oracle."""
    spec = oracles if oracles is None or isinstance(oracles, str) else ",".join(oracles)
    return parse_oracle_names(spec)


def prepare(
    model: str,
    layout: ParallelLayout | str | None = None,
    *,
    oracles: Sequence[str] | str | None = None,
    device: str = "auto",
    hooks: Sequence[str] = (),
    experts: str = "auto",
    spec: str = "te",
    timeout_s: float = 600.0,
    progress: ProgressSink | None = None,
    sender: str | None = None,
    receiver: str | None = None,
    chunk_mb: float = 64.0,
    pad_vocab: int | None = None,
    manifest_out: str | None = None,
    resume_layout: ParallelLayout | str | Sequence[ParallelLayout | str] | None = None,
    target_tp: int | Sequence[int] | None = None,
    target_ep: int | Sequence[int] | None = None,
    target_etp: int | Sequence[int] | None = None,
    layers: int | None = None,
    options: Mapping[str, Any] | None = None,
    nodes: Nodes | None = None,
) -> Any:
    """Validate everything a run needs before any rank starts; return the Job (BadInput names the first problem).

    `sender` / `receiver` / `chunk_mb`: the weight-sync path under test (convcheck.sync; README "Weight-sync paths");
    `pad_vocab=N` builds the padded vocabulary training uses; `manifest_out` makes rank 0 write the gate manifest;
    `resume_layout`: the layout(s) the distckpt oracle resumes its checkpoint at (TP1 when not given);
    `target_tp` / `target_ep` / `target_etp`: the reshard oracle's target TP, EP and expert-TP sizes (each one or
    several; every combination is checked in one launch); `layers`: the layer count of a `config:FILE` model;
    `options`: the oracle-owned options by key (each oracle's OracleInfo.options, e.g. {"save_dtype": "bf16"});
    `nodes`: the run spans hosts, this launcher being one node (convcheck.engine.nodes.make_nodes; docs/scale.md);
    `spec`: the layer specs, "te" (the bridge's Transformer Engine specs, on convcheck's TE stand-in where TE is
    missing; docs/compat.md) or "local" ("te" whatever is asked for an architecture whose bridge spec exists only on TE,
    convcheck.models.te_only); `experts`: "auto" (what the provider asks for), "sequential" or "te-grouped".
    """
    if experts not in EXPERT_LAYOUTS:
        raise BadInput(f"unknown expert layout {experts!r}; known: {', '.join(EXPERT_LAYOUTS)}")
    if spec not in LAYER_SPECS:
        raise BadInput(f"unknown layer spec {spec!r}; known: {', '.join(LAYER_SPECS)}")
    names = as_oracles(oracles, experts)
    grid = as_layout(layout)
    check_pad_vocab(pad_vocab)
    owned = collect_options(names, options)
    check_across_nodes(nodes, grid.world_size, names)
    if manifest_out is not None:
        manifest_out = check_manifest_path(manifest_out)
    if progress is not None and model.startswith(("tiny:", CONFIG_PREFIX)):
        progress({"phase": f"building fixture {model} (cached after the first run)"})
    path = resolve_model(model, layers)
    checkpoint = open_checkpoint(path)
    grid.validate_for(checkpoint.config)
    spec, why = layer_spec_for(spec, checkpoint.config)
    if why is not None:
        print(f"INFO {why}", file=sys.stderr)
    if experts == "te-grouped" and not _has_experts(checkpoint.config):
        raise BadInput(f"--experts te-grouped needs a MoE model; {model} has no experts")
    for hook in hooks:
        parse_hook(hook)
    sender = check_sync(names, grid, sender, receiver, chunk_mb)
    resumes = resume_layouts(names, resume_layout, checkpoint.config, experts, spec)
    targets = reshard_targets(names, target_tp, target_ep, target_etp, checkpoint.config, experts, spec)
    requested = device
    gpus = visible_gpu_count() if device != "cpu" else 0
    here = grid.world_size if nodes is None else nodes.per_node(grid.world_size)  # ranks this host starts
    device, reason = choose_device(device, gpus, max([here, *(r.world_size for r in resumes)]))
    if progress is not None:
        progress({"phase": f"running on {device} ({reason})"})
    return Job(
        model_path=str(Path(path).resolve()),
        model_label=model,
        layers=layers,
        layout=grid,
        device=device,
        oracles=names,
        hooks=tuple(hooks),
        timeout_s=timeout_s,
        experts=experts,
        spec=spec,
        device_reason=reason,
        device_requested=requested,
        sync=SyncOptions(sender=sender, receiver=receiver, chunk_mb=float(chunk_mb)),
        pad_vocab=pad_vocab,
        manifest_out=manifest_out,
        resume_layouts=resumes,
        targets=targets,
        options=owned,
        nodes=nodes,
    )


def _sizes(value: int | Sequence[int] | None, flag: str) -> tuple[int, ...]:
    """One or several positive sizes as a tuple (empty when not given); BadInput naming `flag` otherwise."""
    sizes = () if value is None else (value,) if isinstance(value, int) else tuple(value)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise BadInput(f"{flag} must be a positive integer, got {size!r}")
    return tuple(dict.fromkeys(sizes))


def reshard_targets(
    oracles: tuple[str, ...],
    target_tp: int | Sequence[int] | None,
    target_ep: int | Sequence[int] | None,
    target_etp: int | Sequence[int] | None,
    config: dict[str, Any],
    experts: str = "auto",
    spec: str = "te",
) -> ReshardTargets:
    """The reshard oracle's target TP, EP and expert-TP sizes, checked against the model ((1,) each when not given)."""
    tps, eps, etps = (_sizes(v, f) for v, f in ((target_tp, "--target-tp"), (target_ep, "--target-ep"),
                                                 (target_etp, "--target-etp")))  # fmt: skip
    if "reshard" not in oracles:
        if tps or eps or etps:
            raise BadInput(
                "--target-tp / --target-ep / --target-etp are used only by the reshard oracle; add --oracle reshard"
            )
        return ReshardTargets()
    if experts == "te-grouped" and spec == "local":
        raise BadInput("the reshard oracle plans sequential experts only (no --experts te-grouped; with --spec te "
                       "megatron-core's TEGroupedMLP is planned too)")  # fmt: skip
    geometry = Geometry.from_hf_config(config)
    heads, kv, num_experts = geometry.num_heads, geometry.num_query_groups, geometry.num_experts
    ffn = [f for f in (geometry.ffn, geometry.moe_ffn) if f]
    for tp in tps or (1,):
        if heads % tp or (kv % tp and tp % kv) or any(f % tp for f in ffn):
            raise BadInput(
                f"--target-tp {tp} must divide the {heads} heads and the MLP width(s) {ffn}, and divide or be a "
                f"multiple of the {kv} kv heads"
            )
    for ep in eps:
        if ep > 1 and (not num_experts or num_experts % ep):
            raise BadInput(f"--target-ep must be a positive integer dividing the {num_experts} experts, got {ep!r}")
    moe_ffn = geometry.moe_ffn or geometry.ffn
    for etp in etps:
        if etp > 1 and (not num_experts or moe_ffn % etp):
            raise BadInput(
                f"--target-etp {etp} must divide the expert MLP width ({moe_ffn}) of a model with experts "
                f"({num_experts})"
            )
    return ReshardTargets(tps=tps or (1,), eps=eps or (1,), etps=etps or (1,))


def check_pad_vocab(pad_vocab: int | None) -> None:
    """BadInput unless `pad_vocab` is None or a positive integer."""
    if pad_vocab is None:
        return
    if not isinstance(pad_vocab, int) or isinstance(pad_vocab, bool) or pad_vocab < 1:
        raise BadInput(f"--pad-vocab must be a positive integer, got {pad_vocab!r}")


def resume_layouts(
    oracles: tuple[str, ...],
    requested: ParallelLayout | str | Sequence[ParallelLayout | str] | None,
    config: dict[str, Any],
    experts: str = "auto",
    spec: str = "te",
) -> tuple[ParallelLayout, ...]:
    """The distckpt oracle's resume layouts, each checked against the model (TP1 when none is requested)."""
    wanted = [] if requested is None else [requested] if isinstance(requested, (str, ParallelLayout)) else requested
    layouts = tuple(dict.fromkeys(as_layout(r) for r in wanted))
    if "distckpt" not in oracles:
        if layouts:
            raise BadInput("--resume-layout is used only by the distckpt oracle; add --oracle distckpt")
        return ()
    if experts == "te-grouped" and spec == "local":
        raise BadInput("--experts te-grouped has no sharded state dict: the distckpt oracle cannot run on it (with "
                       "--spec te, megatron-core's TEGroupedMLP has one)")  # fmt: skip
    layouts = layouts or (ParallelLayout(),)
    for layout in layouts:
        layout.validate_for(config)
    return layouts


def _has_experts(config: dict[str, Any]) -> bool:
    return Geometry.from_hf_config(config).num_experts > 0


def check_sync(
    oracles: tuple[str, ...], layout: ParallelLayout, sender: str | None, receiver: str | None, chunk_mb: float
) -> str | None:
    """Resolve the sender and receiver specs and check they fit the run; the sender as a Job stores it."""
    sender = normalize_sender(sender)
    engine = receiver == ENGINE_RECEIVER
    check_adapters(sender, None if engine else receiver, chunk_mb)
    if engine:
        check_python(None, "--receiver vllm", SET_ENV)  # one line saying how to make it when it is missing
        if not {"receiver", "idempotence", "delta"} & set(oracles):
            raise BadInput("--receiver vllm is used only by the receiver, idempotence and delta oracles; add --oracle "
                           "receiver")  # fmt: skip
    elif receiver is not None and not {"receiver", "idempotence"} & set(oracles):
        raise BadInput("--receiver is used only by the receiver and idempotence oracles; add --oracle receiver")
    if layout.world_size < 2 and ("broadcast" in oracles or sender == "broadcast"):
        what = "the broadcast oracle" if "broadcast" in oracles else "--sender broadcast"
        raise BadInput(f"{what} needs at least 2 ranks; the layout {layout.label} has 1")
    return sender


def run(job: Any, log_dir: str | None = None, progress: ProgressSink | None = None) -> Report:
    """Launch the ranks of a prepared Job (then the distckpt resume jobs, and the layout oracle's TP1 job when its
    export differed from the source) and return the Report."""
    started = time.perf_counter()
    with checkpoint_folder(job, log_dir) as job:
        result = run_ranks(job, log_dir=log_dir, progress=progress)
        result = run_resumes(job, result, log_dir, progress)
    return report_of(job, result, started, log_dir, progress)


def run_here(job: Any, log_dir: str | None = None) -> tuple[Report, bool]:
    """Run a prepared Job in the processes of the torchrun running this one (`torchrun ... -m convcheck verify`):
    collective; (the Report, whether this process is rank 0 and prints it). Only rank 0 launches the layout
    oracle's TP1 job (it names differences, it never changes a verdict)."""
    started = time.perf_counter()
    result = importlib.import_module("convcheck.engine.inplace").run_here(job, log_dir)  # this process is a rank
    first = torchrun_place()[0] == 0
    return report_of(job, result, started, log_dir, None, attribute=first), first


def report_of(
    job: Any,
    result: dict[str, Any],
    started: float,
    log_dir: str | None = None,
    progress: ProgressSink | None = None,
    attribute: bool = True,
) -> Report:
    """The Report of a job's rank-0 result: the layout oracle's TP1 attribution (`attribute`), the gate manifest,
    the upstream bugs it knows and the causes."""
    ranked = tuple(OracleVerdict.from_dict(o) for o in result["oracles"])
    attributed = attribute_layout(job, ranked, log_dir, progress) if attribute else ranked
    if job.manifest_out and "manifest" in result:
        write_gate_manifest(job.manifest_out, result["manifest"], attributed)
    verdicts, known = tag_upstream_bugs(
        architecture_of(job.model_path),
        result["versions"].get("megatron-bridge", ""),
        complete(job.oracles, attributed),
        result["versions"],
        config_of(job.model_path),
    )
    return Report(
        model=job.model_label,
        layout=job.layout.to_dict(),
        device=job.device,
        versions=result["versions"],
        oracles=verdicts,
        seconds=time.perf_counter() - started,
        causes=(*known, *explain(job.model_path, verdicts)),
        device_reason=job.device_reason,
        rank0_peak_MB=dict(result.get("rank0_peak_MB", {})),
        rank0_anon_peak_MB=dict(result.get("rank0_anon_peak_MB", {})),
    )


def write_gate_manifest(path: str, parts: dict[str, Any], verdicts: Sequence[OracleVerdict]) -> None:
    """Write the case's gate manifest once: what rank 0 recorded (convcheck.engine.recorder) and the final verdicts."""
    fields = {k: v for k, v in parts.items() if k != "note"}
    write_manifest(path, build_manifest(**fields, verdicts=[v.to_dict() for v in verdicts]))


def verify(
    model: str,
    layout: ParallelLayout | str | None = None,
    *,
    oracles: Sequence[str] | str | None = None,
    device: str = "auto",
    hooks: Sequence[str] = (),
    experts: str = "auto",
    spec: str = "te",
    timeout_s: float = 600.0,
    log_dir: str | None = None,
    progress: ProgressSink | None = None,
    sender: str | None = None,
    receiver: str | None = None,
    chunk_mb: float = 64.0,
    pad_vocab: int | None = None,
    manifest_out: str | None = None,
    resume_layout: ParallelLayout | str | Sequence[ParallelLayout | str] | None = None,
    target_tp: int | Sequence[int] | None = None,
    target_ep: int | Sequence[int] | None = None,
    target_etp: int | Sequence[int] | None = None,
    layers: int | None = None,
    options: Mapping[str, Any] | None = None,
    nodes: Nodes | None = None,
) -> Report:
    """Build `model` sharded at `layout` through the real bridge and run the oracles; ConvcheckError on bad input."""
    job = prepare(
        model,
        layout,
        oracles=oracles,
        device=device,
        hooks=hooks,
        experts=experts,
        spec=spec,
        timeout_s=timeout_s,
        progress=progress,
        sender=sender,
        receiver=receiver,
        chunk_mb=chunk_mb,
        pad_vocab=pad_vocab,
        manifest_out=manifest_out,
        resume_layout=resume_layout,
        target_tp=target_tp,
        target_ep=target_ep,
        target_etp=target_etp,
        layers=layers,
        options=options,
        nodes=nodes,
    )
    return run(job, log_dir=log_dir, progress=progress)


def run_in_ranks(
    function: str,
    model: str = "tiny:qwen3",
    layout: ParallelLayout | str | None = None,
    *,
    kwargs: dict[str, Any] | None = None,
    device: str = "auto",
    hooks: Sequence[str] = (),
    experts: str = "auto",
    spec: str = "te",
    timeout_s: float = 600.0,
    log_dir: str | None = None,
    load_hf: bool = True,
) -> Any:
    """Call `function` (`MODULE:FUNC` or `FILE.py:FUNC`) as FUNC(ctx, **kwargs) in every rank of `model` loaded at
    `layout`; return what rank 0 returned (pickled back). `ctx` is a convcheck.rank.RankContext.

    `load_hf=False`: the model is built but not loaded from the HF checkpoint (the function fills it)."""
    import pickle
    import tempfile
    from dataclasses import replace

    parse_hook(function, what="rank function")
    job = prepare(
        model, layout, oracles=(), device=device, hooks=hooks, experts=experts, spec=spec, timeout_s=timeout_s
    )
    with tempfile.TemporaryDirectory(prefix="convcheck-fn-") as scratch:
        workdir = log_dir or scratch
        kwargs_file = None
        if kwargs:
            kwargs_file = str(Path(workdir) / "kwargs.pkl")
            Path(workdir).mkdir(parents=True, exist_ok=True)
            Path(kwargs_file).write_bytes(pickle.dumps(kwargs))
        job = replace(job, oracles=(), rank_function=function, rank_kwargs_file=kwargs_file, resuming=not load_hf)
        run_ranks(job, log_dir=workdir)
        return pickle.loads(replace(job, workdir=workdir).value_file.read_bytes())
