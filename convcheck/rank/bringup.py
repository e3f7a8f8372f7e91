"""Bring one rank up: process groups, the real bridge, the sharded model loaded from the checkpoint."""

from __future__ import annotations

import os
import traceback
from typing import Any, Callable

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch.distributed as dist
from megatron.bridge import AutoBridge

from convcheck.errors import BadInput, BuildFailed, SetupError, needs_cuda, one_line, raised_at
from convcheck.hf.checkpoint import open_checkpoint
from convcheck.progress import ProgressWriter
from convcheck.rank.context import RankContext
from convcheck.rank.dist import init_distributed, rank_coord
from convcheck.rank.lone import GRACE_S
from convcheck.rank.model import build_model, load_bridge, load_weights, make_provider, unloaded_counts
from convcheck.rank.spec import RankSpec


def _build(bridge: AutoBridge, spec: RankSpec) -> tuple[Any, list[Any]]:
    """The provider and this rank's model chunks; BuildFailed on every rank when the bridge raises on any rank (the
    ranks agree first, so none goes on into a collective the others never reach)."""
    error, limit = None, None
    try:
        provider = make_provider(bridge, spec.layout, spec.device, pad_vocab=spec.pad_vocab, spec=spec.spec)
        model = build_model(provider, spec.device, experts=spec.experts, spec=spec.spec)
    except (BadInput, SetupError):
        raise
    except Exception as exc:  # noqa: BLE001 - a bridge that cannot build a valid model is a finding
        error, limit = f"{one_line(exc)} at {raised_at(exc)}", _environment_limit(exc, spec.device, spec.spec)
    errors: list[tuple[str, str | None] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, (error, limit) if error is not None else None)
    failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
    if not failed:
        return provider, model
    rank, (first, limit) = failed[0]
    more = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
    if limit:
        raise SetupError(f"this megatron-core cannot build the model {limit}: rank {rank}: {first}")
    raise BuildFailed(f"rank {rank}: {first}{more}")


def _refuse_cpu_limited_load(error: str | None, device: str, where: str = "") -> None:
    """SetupError on every rank when the bridge's import raised on any rank because it called CUDA on a CPU run (a
    call convcheck has no CPU shim for) or inside convcheck's own shims (`where`, the innermost frame first, in
    OWN_BUILD_CODE): limits of convcheck, never an import-failed finding; the ranks agree first, so none goes on into
    an oracle's collective alone."""
    why = import_limit(error, device, where)
    flags: list[tuple[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(flags, (why, error) if why is not None else None)
    failed = [(rank, e) for rank, e in enumerate(flags) if e is not None]
    if failed:
        rank, (why, first) = failed[0]
        cuda = "; run with --device cuda" if why.startswith("on the CPU") else ""
        raise SetupError(f"this checkpoint cannot be loaded {why} (rank {rank}: {first}){cuda}")


def import_limit(error: str | None, device: str, where: str) -> str | None:
    """Why an import error (`where`: its frames, innermost first, as `raised_at` gives them) is convcheck's limit,
    not the bridge's: a CUDA call on a CPU run, or a raise inside OWN_BUILD_CODE; None for a finding."""
    if error is None:
        return None
    if device == "cpu" and needs_cuda(RuntimeError(error)):
        return "on the CPU: the bridge's import calls CUDA where convcheck has no CPU shim"
    own = own_site(where.split(" <- ")[0])
    return OWN_CODE_LIMIT.format(own) if own is not None else None


TE_REQUIRED = "TransformerEngine is required"
"""megatron-core's assertion where a feature has no TE-free implementation (0.19.2 transformer/moe/moe_layer.py:266:
the latent MoE projections of Nemotron-3 Super)."""


def _environment_limit(exc: BaseException, device: str, layer_spec: str = "local") -> str | None:
    """Why the build failed because of this environment, not the bridge (None: a bridge failure): a Transformer Engine
    class megatron-core left None because TE is missing (`isinstance(x, TEClass)` with TEClass None), a TE version
    check without TE (megatron-core's get_te_version() is None, compared with a Version: the 0.3.0 GPT-OSS provider),
    or, on a CPU run, upstream code that calls CUDA where convcheck has no CPU shim; with `--spec te`, what
    convcheck's Transformer Engine stand-in does not build (it raised, or upstream refused one of its classes)."""
    from convcheck.compat import transformer_engine_available

    if isinstance(exc, AssertionError) and TE_REQUIRED in str(exc):  # megatron-core's own "needs TE" asserts
        return None if transformer_engine_available() else "without Transformer Engine"
    if layer_spec == "te" and standin_limit(exc):
        return "on convcheck's Transformer Engine stand-in (--spec te)"
    own = own_frame(exc)
    if own is not None:
        return OWN_CODE_LIMIT.format(own)

    te_missing = "isinstance() arg 2 must be a type" in str(
        exc
    ) or "not supported between instances of 'NoneType' and 'Version'" in str(exc)
    if isinstance(exc, TypeError) and te_missing:
        return None if transformer_engine_available() else "without Transformer Engine"
    if device == "cpu" and needs_cuda(exc):
        return "on the CPU (it calls CUDA where convcheck has no CPU shim; run with --device cuda)"
    return None


OWN_BUILD_CODE = ("/convcheck/compat/", "/convcheck/kernels/")
"""convcheck's code a build runs through (compat shims, the TE stand-in's kernels): an error raised there is
convcheck's own limit on this release, never a bridge finding (a planted bug raises from convcheck/mutants/)."""


OWN_CODE_LIMIT = "through convcheck's compatibility code (it raised at {})"
"""Why a build or import stopped in OWN_BUILD_CODE (its `convcheck/...:line` filled in)."""


def own_site(site: str) -> str | None:
    """`convcheck/...:line` of a `path:line` site that lies in OWN_BUILD_CODE, else None."""
    if not any(part in site for part in OWN_BUILD_CODE):
        return None
    return "convcheck/" + site.rpartition("/convcheck/")[2]


def own_frame(exc: BaseException) -> str | None:
    """own_site of the innermost traceback frame of `exc`."""
    frames = traceback.extract_tb(exc.__traceback__)
    return own_site(f"{frames[-1].filename}:{frames[-1].lineno}") if frames else None


STANDIN_PACKAGE = "convcheck/kernels/te/"
"""Where the Transformer Engine stand-in lives (a build error raised there is convcheck's, not the bridge's)."""


def standin_limit(exc: BaseException) -> bool:
    """True when a build error is a limit of convcheck's TE stand-in, not the bridge's: a setting it does not compute
    (NotImplementedError raised in its code), an upstream check that refuses one of its classes (the message names
    convcheck.kernels.te), an argument its signature lacks (TypeError naming a stand-in's __init__), or a TE name the
    stand-in is not bound to (megatron-core's MagicMock placeholder for TE was reached)."""
    from convcheck.kernels.te import STAND_INS

    message = str(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, NotImplementedError):
        return any(STANDIN_PACKAGE in f.filename for f in frames)
    if "Mock object" in message or any(f.filename.endswith("unittest/mock.py") for f in frames):
        return True
    if isinstance(exc, TypeError) and any(f"{name}.__init__()" in message for name in STAND_INS):
        return True
    return "convcheck.kernels.te" in message


def bring_up(spec: RankSpec, hooks: tuple[Callable[[], Any], ...] = (), load: bool = True) -> RankContext:
    """Initialise the groups, run `hooks`, build the model through the bridge and (by default) load the weights."""
    rank = int(os.environ.get("RANK", "0"))
    progress = ProgressWriter(spec.progress_file if rank == 0 else None)
    progress.emit("importing megatron-core and megatron-bridge")
    from convcheck import compat  # lazy: imports torch (launcher side), after the progress line above

    compat.install(spec.device, spec.spec)

    checkpoint = open_checkpoint(spec.model_path)
    rank, world = init_distributed(spec.layout, spec.device, spec.timeout_s)
    for hook in hooks:
        hook()
    bridge = load_bridge(spec.model_path)
    progress.emit("building the sharded model")
    provider, model = _build(bridge, spec)
    ctx = RankContext(
        rank=rank,
        world=world,
        layout=spec.layout,
        coord=rank_coord(),
        device=spec.device,
        checkpoint=checkpoint,
        bridge=bridge,
        provider=provider,
        model=model,
        write_manifest=spec.write_manifest,
        progress=progress,
        sync=spec.sync,
        checkpoint_dir=spec.checkpoint_dir,
        resuming=spec.resuming,
        targets=spec.targets,
        options=spec.options,
        workdir=spec.workdir,
        timeout_s=spec.timeout_s,
    )
    if load:
        progress.emit("loading the checkpoint through the bridge")
        failed = load_weights(bridge, model)
        ctx.load_error = failed[0] if failed else None
        grace = min(GRACE_S, spec.timeout_s / 4)
        ctx.stages.ended("import", f"{failed[0]} at {failed[1]}" if failed else None, grace_s=grace)
        _refuse_cpu_limited_load(ctx.load_error, spec.device, failed[1] if failed else "")
        ctx.not_loaded = unloaded_counts(ctx.global_name, model)
    return ctx
