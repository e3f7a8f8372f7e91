"""The mapping oracle's shard check done inside roundtrip's drain, on the source tensors that drain reads anyway.

Rank 0 reads every source tensor in roundtrip to compare it with the export; the tap holds the ones a local
parameter's explicit mapping needs until that parameter has all of them, then checks the shard against the mapping's
`to_shard` on the shard's device. Other ranks read only their own parameters' source tensors as the names stream by.
The mapping oracle skips a parameter proven here (same tensor, not written since); anything else (a mismatch, a name
the export never yielded, a parameter over the hold budget) it checks itself and names the first wrong element.
The run's explicit registry is built here once (`names_and_registry`), for the tap and the oracle alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.model_provider import ModelProviderMixin
from megatron.bridge.utils.vocab_utils import calculate_padded_vocab_size

from convcheck.errors import NotCovered
from convcheck.hf.tensors import TensorReader
from convcheck.mappings import Geometry, MappingError
from convcheck.mappings.check import shard_matches
from convcheck.mappings.fused_experts import stored_as_linear
from convcheck.models.mapping_registry import build_registry
from convcheck.rank.context import RankContext

HOLD_BYTES = 2 << 30
"""Source bytes one rank holds for parameters still waiting on a tensor; a parameter that would pass it is left to
the mapping oracle."""


@dataclass
class ShardTap:
    """One rank's covered parameters, the source tensors held for them, and the ones proven equal to `to_shard`."""

    ctx: RankContext
    registry: Any
    all_names: set[str]
    local: dict[str, Any]
    """Global name -> this rank's tensor, for the parameters the registry covers."""
    needs: dict[str, set[str]] = field(default_factory=dict)
    """Parameter -> source names it still waits for."""
    users: dict[str, set[str]] = field(default_factory=dict)
    """Source name -> waiting parameters that need it."""
    alone: dict[str, str] = field(default_factory=dict)
    """Source name -> the one parameter that needs it and nothing else (settle): checked as it comes, never held."""
    private: dict[str, str] = field(default_factory=dict)
    """Source name -> the one parameter that needs it, among others no other parameter needs (settle)."""
    parts: dict[str, tuple[frozenset[str], dict[str, Any]]] = field(default_factory=dict)
    """Parameter of `private` names -> (those names, the ones held so far): checked once all have come."""
    held: dict[str, Any] = field(default_factory=dict)
    held_bytes: int = 0
    proven: dict[str, tuple[Any, int]] = field(default_factory=dict)
    """Parameter -> (its tensor, that tensor's version counter when proven)."""
    seconds: float = 0.0
    reader: Any = None

    def offer(self, name: str, source: Any = None) -> None:
        """One exported name, with its source tensor when the caller read it (else read here if a parameter needs
        it)."""
        started = time.perf_counter()
        if (param := self.alone.pop(name, None)) is not None:
            self._alone(param, name, source)
        elif (param := self.private.pop(name, None)) is not None:
            self._add_part(param, name, source)
        elif (waiting := self.users.get(name)) and name not in self.held:
            self._take(name, waiting, source)
        else:
            return
        self.seconds += time.perf_counter() - started

    def _alone(self, param: str, name: str, source: Any) -> None:
        """Check `param` against its one tensor as it comes (nothing held)."""
        try:
            source = self._read(name) if source is None else source
            self._verify(param, {name: _on(source, self.local[param].device)})
        except Exception:  # noqa: BLE001,S110 - left unproven: the oracle checks it itself
            pass

    def _take(self, name: str, waiting: set[str], source: Any) -> None:
        """Hold a tensor several parameters wait for; check each of them that has all of its tensors now."""
        try:
            kept = self._admit(name, source, self.local[next(iter(waiting))].device)
            if kept is None:
                for param in list(waiting):
                    self._drop(param)
                return
            self.held[name] = kept
            for param in list(waiting):
                self.needs[param].discard(name)
                if not self.needs[param]:
                    self._check(param)
        except Exception:  # noqa: BLE001 - never roundtrip's failure: the oracle checks these parameters itself
            for param in list(self.users.get(name, ())):
                self._drop(param)

    def _add_part(self, param: str, name: str, source: Any) -> None:
        """Hold one of `param`'s private tensors; with the last of them, check the parameter and let them go."""
        try:
            kept = self._admit(name, source, self.local[param].device)
            if kept is None:
                self._abandon(param)
                return
            names, got = self.parts[param]
            got[name] = kept
            if len(got) == len(names):
                self._abandon(param)
                self._verify(param, got)
        except Exception:  # noqa: BLE001 - left unproven: the oracle checks it itself
            self._abandon(param)

    def _admit(self, name: str, source: Any, device: Any) -> Any | None:
        """`name`'s tensor (read here when not given) on `device`, counted in `held_bytes`; None, nothing counted, when
        it would pass the hold budget."""
        source = self._read(name) if source is None else source
        size = source.numel() * source.element_size()
        if self.held_bytes + size > HOLD_BYTES:
            return None
        kept = _on(source, device)
        self.held_bytes += size
        return kept

    def _abandon(self, param: str) -> None:
        """Let go of `param`'s private tensors held so far and of the names still to come for it."""
        names, got = self.parts.pop(param, (frozenset(), {}))
        for name in names:
            self.private.pop(name, None)
        self.held_bytes -= sum(t.numel() * t.element_size() for t in got.values())

    def finish(self) -> None:
        """Drop what is still held: parameters whose tensors the export never yielded are left to the oracle."""
        for param in list(self.needs):
            self._drop(param)
        for param in list(self.parts):
            self._abandon(param)

    def is_proven(self, name: str, tensor: Any) -> bool:
        """True when `tensor` is the one proven equal to its mapping's shard and nothing wrote into it since."""
        entry = self.proven.get(name)
        return entry is not None and entry[0] is tensor and entry[1] == tensor._version

    def settle(self) -> None:
        """Move each parameter whose source tensors no other parameter needs from the waiting sets: one tensor to
        `alone`, several to `private` (held in `parts` only until the last comes)."""
        for param, names in list(self.needs.items()):
            if not names or any(self.users.get(n) != {param} for n in names):
                continue
            if len(names) == 1:
                self.alone[next(iter(names))] = param
            else:
                self.parts[param] = (frozenset(names), {})
                self.private.update(dict.fromkeys(names, param))
            for name in names:
                del self.users[name]
            del self.needs[param]

    def _check(self, param: str) -> None:
        mapping = self.registry.mappings[param]
        self._verify(param, {n: self.held[n] for n in mapping.hf_names if n in self.held})
        self._drop(param)

    def _verify(self, param: str, hf: dict[str, Any]) -> None:
        """Prove `param` when its shard is its mapping's to_shard of `hf`."""
        mapping, tensor = self.registry.mappings[param], self.local[param]
        if shard_matches(mapping, hf, self.ctx.layout, self.ctx.coord, tensor):
            self.proven[param] = (tensor, tensor._version)

    def _drop(self, param: str) -> None:
        for name in self.needs.pop(param, set()).union(self.registry.mappings[param].hf_names):
            users = self.users.get(name)
            if users is None:
                continue
            users.discard(param)
            if not users:
                del self.users[name]
                gone = self.held.pop(name, None)
                if gone is not None:
                    self.held_bytes -= gone.numel() * gone.element_size()

    def _read(self, name: str) -> Any:
        self.reader = self.reader or TensorReader(self.ctx.checkpoint)
        return self.reader.get(name)


def _on(tensor: Any, device: Any) -> Any:
    """`tensor` on `device` (itself when it is there)."""
    return tensor if tensor.device == device else tensor.to(device)


def names_and_registry(ctx: RankContext) -> tuple[dict[str, Any], set[str], Any]:
    """Collective: this rank's tensors by global name, every rank's names, and the explicit registry for them
    (raises MappingError, the same on every rank)."""
    local = dict(ctx.named_parameters())
    all_names = {n for names in ctx.gather(sorted(local)) for n in names}
    return local, all_names, registry_for(ctx, all_names)


def padded_vocab(provider: ModelProviderMixin, vocab: int, tp: int) -> int:
    """The embedding rows the provider builds: the HF vocab, or padded when the provider pads it."""
    if not getattr(provider, "should_pad_vocab", False):
        return vocab

    return int(calculate_padded_vocab_size(vocab, provider.make_vocab_size_divisible_by, tp))


def registry_for(ctx: RankContext, all_names: set[str]) -> Any:
    """The explicit registry for this model, built leniently: parameters it does not cover are not checked."""
    config = ctx.checkpoint.config
    vocab = Geometry.from_hf_config(config).vocab  # a nested text_config's first (Geometry's rule)
    if not vocab:  # e.g. Qwen2.5-Omni's thinker_config.text_config: no explicit mappings for it
        raise NotCovered(
            f"convcheck has no explicit mappings for {ctx.checkpoint.architecture}: its config has no "
            "vocab_size at its top level or in its text_config"
        )
    geometry = Geometry.from_hf_config(config, padded_vocab=padded_vocab(ctx.provider, vocab, ctx.layout.tp))
    megatron = ctx.model[0].config
    shapes = {name: tuple(entry.shape) for name, entry in ctx.checkpoint.tensors.items()}
    geometry = replace(
        geometry,
        te_spec=getattr(megatron, "transformer_impl", "local") == "transformer_engine",
        fused_experts_as_linear=stored_as_linear(shapes, geometry.hidden, geometry.moe_ffn),
    )
    tied = bool(getattr(megatron, "share_embeddings_and_output_weights", False))
    return build_registry(
        ctx.checkpoint.architecture, geometry, all_names, ctx.checkpoint.tensors, tied=tied, strict=False
    )


def start(ctx: RankContext) -> ShardTap | None:
    """Collective: this rank's tap (None where the registry cannot be built; the mapping oracle reports why)."""
    try:
        local, all_names, registry = names_and_registry(ctx)
    except MappingError:
        return None
    source = ctx.checkpoint.tensors
    tap = ShardTap(ctx=ctx, registry=registry, all_names=all_names, local={})
    for name, tensor in local.items():
        mapping = registry.get(name)
        if mapping is None:
            continue
        tap.local[name] = tensor
        needs = {n for n in mapping.hf_names if n in source}
        if not needs:
            continue
        tap.needs[name] = needs
        for hf in needs:
            tap.users.setdefault(hf, set()).add(name)
    tap.settle()
    return tap
