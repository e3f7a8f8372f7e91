"""Rank side of the gate manifest: tap the export the oracles drain, gather the conversion tasks; rank 0 hands the
parts to the launcher, which writes the manifest once with the final verdicts."""

from __future__ import annotations

import time
from typing import Any

from convcheck.compare.bits import tensor_sha256
from convcheck.errors import one_line
from convcheck.gate.case import Case
from convcheck.gate.manifest import jsonable
from convcheck.hf.tensors import TensorReader
from convcheck.oracles.config import flatten
from convcheck.rank.context import RankContext
from convcheck.versions import versions


def tensor_entry(tensor: Any) -> dict[str, Any]:
    """dtype, shape and sha256 of a tensor's raw bytes."""
    return {
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "sha256": tensor_sha256(tensor),
    }


class ExportTap:
    """Records (rank 0) the digests of the first export stream drained to its end, so no extra drain is needed."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.done = False
        self.drained_again = False
        self.tensors: dict[str, dict[str, Any]] = {}
        self.error: str | None = None
        self._seen: dict[str, dict[str, Any]] | None = None

    def start(self) -> None:
        self._seen = {} if not self.done and self.ctx.is_reporter else None

    def consume(self, name: str, tensor: Any) -> None:
        if self._seen is None:
            return
        if name in self._seen:
            self._seen[name]["copies"] = self._seen[name].get("copies", 1) + 1
        else:
            self._seen[name] = tensor_entry(tensor)

    def finish(self, export_error: str | None) -> None:
        if not self.done:
            self.done, self.tensors, self.error = True, self._seen or {}, export_error
        self._seen = None

    def digests(self) -> tuple[dict[str, dict[str, Any]], str | None]:
        """Collective: the recorded digests, draining the export once when no oracle drained it to its end."""
        if not self.done:
            self.drained_again = True
            for _ in self.ctx.export():
                pass
        return self.tensors, self.error


def describe_mapping(mapping: Any, module: Any) -> dict[str, Any]:
    """Mapping class, the HF names it converts to, and (AutoMapping) the parallelism it resolves to."""
    if mapping is None:
        return {"mapping": None, "hf": None}
    out: dict[str, Any] = {"mapping": type(mapping).__name__, "hf": jsonable(mapping.hf_param)}
    detect = getattr(mapping, "_detect_parallelism_type", None)
    if detect is not None and module is not None:
        try:
            out["resolved"] = str(detect(module))
        except Exception:  # noqa: BLE001 - a mapping that cannot tell is recorded without it
            pass
    return out


def local_tasks(ctx: RankContext) -> dict[str, dict[str, Any]]:
    """This rank's global Megatron parameter -> its bridge mapping (registry lookup, as the conversion does)."""
    registry = ctx.mapping_registry()
    chunks = []
    for chunk in ctx.model:
        while hasattr(chunk, "module"):
            chunk = chunk.module
        chunks.append(chunk)
    out = {}
    for vp_stage, local, name, _ in ctx.local_tensors():
        try:
            module = chunks[vp_stage].get_submodule(local.rpartition(".")[0])
        except AttributeError:
            module = None
        out[name] = describe_mapping(registry.megatron_to_hf_lookup(name), module)
    return out


def exported_config(ctx: RankContext) -> dict[str, Any]:
    """The HF config the bridge writes for this model (its megatron_to_hf_config), flattened one level."""
    try:
        return flatten(type(ctx.bridge._model_bridge).megatron_to_hf_config(ctx.provider))
    except Exception as exc:  # noqa: BLE001 - recorded, and compared like any field
        return {"<megatron_to_hf_config>": f"raised {one_line(exc)}"}


def source_entries(ctx: RankContext) -> dict[str, dict[str, Any]]:
    """dtype, shape and sha256 of every tensor of the source checkpoint (rank 0)."""
    reader = TensorReader(ctx.checkpoint)
    return {name: tensor_entry(reader.get(name)) for name in sorted(ctx.checkpoint.tensors)}


class ManifestRecorder:
    """Started before the oracles (taps the export, reads the exported config), finished after them."""

    def __init__(self, ctx: RankContext, tap: ExportTap) -> None:
        self.ctx = ctx
        self.tap = tap
        self.config = exported_config(ctx) if ctx.is_reporter else {}

    @classmethod
    def start(cls, ctx: RankContext) -> "ManifestRecorder":
        """Add the export tap to the run's export pass (the first full stream is digested on its way) and read the
        config."""
        tap = ExportTap(ctx)
        ctx.exports.add(tap)
        return cls(ctx, tap)

    def finish(self, job: Any) -> dict[str, Any] | None:
        """Collective: gather the tasks, complete the digests; rank 0 returns the manifest's parts (the launcher
        writes the manifest once, with the run's final verdicts: convcheck.gate.manifest.build_manifest)."""
        started = time.perf_counter()
        gathered = self.ctx.gather(local_tasks(self.ctx))
        exported, error = self.tap.digests()
        if not self.ctx.is_reporter:
            return
        tasks: dict[str, Any] = {}
        for part in gathered:
            for name, entry in part.items():
                tasks.setdefault(name, entry)
        case = Case(
            model=job.model_label, layout=job.layout, pad_vocab=job.pad_vocab, experts=job.experts, spec=job.spec
        )
        run = {"versions": versions(), "device": job.device, "hooks": list(job.hooks)}
        how = "a second export drain" if self.tap.drained_again else "the oracles' export stream"
        return {
            "case": case.to_dict(),
            "run": run,
            "source": source_entries(self.ctx),
            "exported": exported,
            "export_error": error,
            "tasks": tasks,
            "config": self.config,
            "note": f"digests from {how} in {time.perf_counter() - started:.3f} s",
        }
