"""Entry point of one rank under torchrun: build the real bridge model, run the oracles, write the result."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

from convcheck.engine.job import Job, write_json_atomic
from convcheck.errors import BadInput


def _quiet() -> None:
    """Keep upstream warnings and info logs out of the way (they still reach the rank log)."""
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)


def load_hook(spec: str) -> Callable[[], Any]:
    """Resolve `module:function` or `path/to/file.py:function`."""
    target, _, func = spec.rpartition(":")
    if not target or not func:
        raise BadInput(f"hook {spec!r} is not of the form MODULE:FUNCTION or FILE.py:FUNCTION")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise BadInput(f"hook file not found: {target}")
        module_spec = importlib.util.spec_from_file_location(f"convcheck_hook_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
        module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        module = importlib.import_module(target)
    if not hasattr(module, func):
        raise BadInput(f"hook {spec!r}: {target} has no attribute {func!r}")
    return getattr(module, func)


def fill_sentinel(model: list[Any]) -> None:
    """Set every floating parameter and persistent buffer to NaN, so anything the import skips shows."""
    import torch

    from convcheck.engine.model import named_tensors

    with torch.no_grad():
        for _, _, tensor in named_tensors(model):
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))


def unloaded_counts(ctx_global_name: Callable[[str, int], str], model: list[Any]) -> dict[str, int]:
    """Global name -> count of elements that still hold the NaN sentinel after the import."""
    from convcheck.engine.model import named_tensors

    out = {}
    for vp_stage, local, tensor in named_tensors(model):
        if tensor.is_floating_point():
            count = int(tensor.isnan().sum())
            if count:
                out[ctx_global_name(local, vp_stage)] = count
    return out


def load_bridge(model_path: str) -> Any:
    """The real AutoBridge for a checkpoint; an unsupported architecture is bad input."""
    from megatron.bridge import AutoBridge

    try:
        return AutoBridge.from_hf_pretrained(model_path)
    except Exception as exc:  # the bridge wraps every failure in ValueError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise BadInput(f"the bridge cannot load {model_path}: {first}") from None


def run_job(job: Job) -> dict[str, Any] | None:
    """Run every selected oracle on this rank; return the result dict on rank 0, None elsewhere."""
    from convcheck import compat

    compat.install(job.device)
    from convcheck.checkpoint import open_checkpoint
    from convcheck.engine.context import RankContext, one_line
    from convcheck.engine.dist import init_distributed, rank_coord
    from convcheck.engine.model import build_model, make_provider
    from convcheck.oracles import load_oracle
    from convcheck.versions import versions

    started = time.perf_counter()
    checkpoint = open_checkpoint(job.model_path)
    oracles = [load_oracle(name) for name in job.oracles]
    hooks = [load_hook(h) for h in job.hooks]
    rank, world = init_distributed(job.layout, job.device, job.timeout_s)
    for hook in hooks:
        hook()
    bridge = load_bridge(job.model_path)
    provider = make_provider(bridge, job.layout, job.device)
    model = build_model(provider, job.device, experts=job.options.get("experts", "sequential"))
    fill_sentinel(model)
    load_error = None
    try:
        bridge.load_hf_weights(model)
    except Exception as exc:  # noqa: BLE001 - reported by the oracles as a finding
        load_error = one_line(exc)
    ctx = RankContext(
        rank=rank,
        world=world,
        layout=job.layout,
        coord=rank_coord(),
        device=job.device,
        checkpoint=checkpoint,
        bridge=bridge,
        provider=provider,
        model=model,
        load_error=load_error,
    )
    ctx.not_loaded = unloaded_counts(ctx.global_name, model)
    verdicts = []
    for oracle in oracles:
        t0 = time.perf_counter()
        verdict = oracle(ctx)
        if verdict is not None:
            verdicts.append({**verdict.to_dict(), "seconds": round(time.perf_counter() - t0, 3)})
    if rank != 0:
        return None
    return {
        "status": "ok",
        "versions": versions(),
        "oracles": verdicts,
        "seconds": round(time.perf_counter() - started, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """torchrun target: `python -m convcheck.engine.worker JOB.json`."""
    argv = sys.argv[1:] if argv is None else argv
    _quiet()
    job = Job.load(argv[0])
    rank = int(os.environ.get("RANK", "0"))
    try:
        result = run_job(job)
        if result is not None:
            write_json_atomic(job.result_file, result)
    except BadInput as exc:
        write_json_atomic(job.error_file(rank), {"status": "bad_input", "rank": rank, "error": str(exc)})
        return 3
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line for the launcher
        write_json_atomic(
            job.error_file(rank),
            {
                "status": "error",
                "rank": rank,
                "error": f"{exc.__class__.__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                "traceback": traceback.format_exc(),
            },
        )
        traceback.print_exc()
        return 4
    finally:
        try:
            from convcheck.engine.dist import shutdown_distributed

            shutdown_distributed()
        except Exception:  # noqa: BLE001 - teardown after a failure must not mask it
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
