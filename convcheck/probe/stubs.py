"""Probe copies of real bridge mappings: groups that know their rank and size but cannot communicate.

A probe copy runs the REAL `megatron_to_hf` of a mapping (and of every nested mapping), with the collective
helpers of MegatronParamMapping replaced by local synthesis: this rank's shard at its true rank index, pooled
zero placeholders elsewhere. Any other communication raises ProbeCommError (a finding, never a silent pass).
"""

from __future__ import annotations

import contextlib
import copy
import re
import types
from dataclasses import dataclass, field
from typing import Any, Iterator

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
import torch.distributed as dist
from megatron.bridge.models.conversion.param_mapping import AutoMapping, MegatronParamMapping
from megatron.bridge.utils.common_utils import extract_expert_number_from_param

from convcheck.probe.values import follow_moves_only

_GROUP_ATTRS = ("pp_group", "ep_group", "_tp_group", "_etp_group")
_DIST_CALLS = (
    "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast", "broadcast_object_list",
    "all_reduce", "reduce", "scatter", "gather", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "send", "recv", "isend", "irecv", "barrier", "scatter_object_list", "gather_object",
)  # fmt: skip


EXPERT_ID = re.compile(r"(experts\.)(\d+)")
"""An expert id in an HF name: the EP gather's contract rewrites every one (and convcheck.probe.shared moves them)."""


class ProbeCommError(RuntimeError):
    """A mapping communicated in a way the probe does not synthesise."""


class ProbeGroup:
    """Stand-in process group: real `rank()` and `size()`, any other use raises ProbeCommError."""

    def __init__(self, rank: int, size: int, label: str, state: "ProbeState | None" = None) -> None:
        self._rank, self._size, self._label = rank, size, label
        self._state = state
        """The probe run's state, for a torch.distributed.all_gather over this group (synthesised_all_gather)."""

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def __getattr__(self, name: str) -> Any:
        raise ProbeCommError(
            f"probe: the mapping used {self._label}.{name} (communication the probe cannot synthesise)"
        )

    def __repr__(self) -> str:
        return f"ProbeGroup({self._label}, rank={self._rank}, size={self._size})"


SHARED_PLACEHOLDER_BYTES = 64 << 20
"""Placeholders up to this size live in the caller's pool and serve every later task of the same shape."""


@dataclass
class ProbeState:
    """Shared by the probe copies of one run: placeholder pool and the gathers synthesised for this task."""

    pool: dict[tuple[tuple[int, ...], Any, Any], Any] = field(default_factory=dict)
    """Placeholders of this run and (when the caller passes its own dict) of earlier runs, by (shape, dtype, device)."""
    versions: dict[tuple[tuple[int, ...], Any, Any], int] = field(default_factory=dict)
    writer: set[tuple[str, int]] = field(default_factory=set)
    """(group kind, this rank's index in it) for every gather of size > 1 the task went through."""
    local: dict[tuple[tuple[int, ...], Any, Any], Any] = field(default_factory=dict)
    """Placeholders too large to keep in `pool` past this run."""

    def placeholder(self, like: Any) -> Any:
        """A zero tensor shaped like `like`, shared per (shape, dtype): codes are >= 1, so 0 means 'not mine'."""
        key = (tuple(like.shape), like.dtype, like.device)
        found = self.pool.get(key, self.local.get(key))
        if found is None:
            found = torch.zeros(like.shape, dtype=like.dtype, device=like.device)
            keep = found.numel() * found.element_size() <= SHARED_PLACEHOLDER_BYTES
            (self.pool if keep else self.local)[key] = found
            self.versions[key] = found._version
        return found

    def check_pool(self) -> None:
        """Raise when a mapping wrote into a placeholder in place (its outputs would then lie); only a placeholder
        whose version counter moved is read, and one written with zeros is still a placeholder."""
        for key, tensor in (*self.pool.items(), *self.local.items()):
            if tensor._version != self.versions.get(key, tensor._version):
                if bool(tensor.ne(0).any()):
                    self.pool.pop(key, None)  # never serve a written placeholder to a later task
                    shape, dtype, _device = key
                    raise ProbeCommError(f"probe: a mapping wrote in place into a placeholder {list(shape)} {dtype}")
                self.versions[key] = tensor._version

    def is_placeholder(self, tensor: Any) -> bool:
        """True when `tensor` is a view of a placeholder (after `check_pool`: all zeros, nothing of this rank)."""
        ptr = tensor.untyped_storage().data_ptr()
        return any(
            p.untyped_storage().data_ptr() == ptr and p.dtype == tensor.dtype
            for p in (*self.pool.values(), *self.local.values())
        )


def _gather_from_tp_ranks(self: Any, tensor: Any) -> list[Any]:
    size = self.tp_size
    if size == 1:
        return [tensor]
    state: ProbeState = self._convcheck_probe
    rank = self.tp_rank
    state.writer.add(("etp" if self.is_expert else "tp", rank))
    out = [state.placeholder(tensor) for _ in range(size)]
    out[rank] = tensor
    return out


def _gather_from_ep_ranks(self: Any, megatron_weights: Any, megatron_module: Any, hf_param_name: Any) -> dict[str, Any]:
    """The contract of MegatronParamMapping.gather_from_ep_ranks (global ids L + k * E/S), synthesised locally."""
    size = self.ep_size
    if size == 1:
        return {str(hf_param_name): megatron_weights}
    if megatron_module is None or megatron_weights is None:
        raise ProbeCommError("probe: EP gather on a rank without the expert (needs a PP broadcast of the config)")
    per_rank = self._get_config(megatron_module).num_moe_experts // size
    local = extract_expert_number_from_param(self.megatron_param) % per_rank
    names = [EXPERT_ID.sub(rf"\g<1>{int(local) + per_rank * i}", str(hf_param_name)) for i in range(size)]
    if str(hf_param_name) not in names:
        raise ProbeCommError(f"probe: EP gather name {hf_param_name} is not among the global names {names}")
    state: ProbeState = self._convcheck_probe
    rank = self.ep_rank
    state.writer.add(("ep", rank))
    gathered = [state.placeholder(megatron_weights) for _ in range(size)]
    gathered[rank] = megatron_weights
    out: dict[str, Any] = {}
    for i, name in enumerate(names):
        piece = gathered[i].unsqueeze(0)
        out[name] = torch.cat([out[name], piece], dim=0) if name in out else piece
    return {name: t.squeeze() for name, t in out.items()}


def _broadcast_from_pp_rank(self: Any, tensor: Any, cache_key: Any = None) -> Any:
    return tensor  # the owning stage keeps its tensor; a non-owner owns nothing of it


def _broadcast_obj_from_pp_rank(self: Any, obj: Any, cache_key: Any = None) -> Any:
    return obj


def _refuse(what: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ProbeCommError(f"probe: {what} is not synthesised by the probe (export path used an import collective?)")

    return method


_STUBS = {
    "gather_from_tp_ranks": _gather_from_tp_ranks,
    "gather_from_ep_ranks": _gather_from_ep_ranks,
    "broadcast_from_pp_rank": _broadcast_from_pp_rank,
    "broadcast_obj_from_pp_rank": _broadcast_obj_from_pp_rank,
    "gather_from_ep_ranks_scale": _refuse("gather_from_ep_ranks_scale"),
    "broadcast_tensor_to_tp_ranks": _refuse("broadcast_tensor_to_tp_ranks"),
    "scatter_to_tp_ranks": _refuse("scatter_to_tp_ranks"),
}


_PLAIN = (str, int, float, bool, type(None), bytes)


def nested_mappings(mapping: Any) -> list[Any]:
    """`mapping` and every mapping inside it (in an attribute, or a list, tuple or dict of them), as probe_copy
    walks them."""
    found, todo, seen = [], [mapping], set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        found.append(obj)
        for value in list(vars(obj).values()) if hasattr(obj, "__dict__") else ():
            items = list(value.values()) if isinstance(value, dict) else value
            todo.extend(v for v in (items if isinstance(items, (list, tuple)) else (items,)) if _is_mapping(v))
    return found


def _is_mapping(obj: Any) -> bool:
    if type(obj) in _PLAIN:  # most attributes: names, sizes, flags (no isinstance walk over the ABCs)
        return False
    if isinstance(obj, (MegatronParamMapping, ProbeGroup)):
        return not isinstance(obj, ProbeGroup)
    return hasattr(type(obj), "megatron_to_hf") and "_base_mapping" in getattr(obj, "__dict__", {})


def warm(mapping: Any, module: Any) -> None:
    """Create every lazily built AutoMapping delegate (recursively) from the task's module, as the real run would."""
    if module is None:
        return
    if isinstance(mapping, AutoMapping) and mapping._mapping is None:
        mapping._detected_type = mapping._detect_parallelism_type(module)
        mapping._mapping = mapping._get_or_create_mapping(mapping._detected_type)
    for value in list(vars(mapping).values()):
        if _is_mapping(value):
            warm(value, module)


def probe_copy(mapping: Any, state: ProbeState) -> Any:
    """A recursive copy of `mapping` whose groups cannot communicate and whose collectives are local."""
    new = copy.copy(mapping)
    if isinstance(new, MegatronParamMapping):
        for attr in _GROUP_ATTRS:
            group = getattr(mapping, attr, None)
            if group is not None:
                setattr(new, attr, ProbeGroup(group.rank(), group.size(), attr.lstrip("_"), state))
        new._broadcast_obj_cache = {}
        new._tensor_spec_output_cache = {}
        new._pg_collection = None
        new._convcheck_probe = state
        for name, func in _STUBS.items():
            if overrides(type(new), name):
                continue  # the class's own collective step (ERNIE 4.5 VL's offset EP gather) runs, its
                # torch.distributed.all_gather synthesised over the probe groups (synthesised_all_gather)
            setattr(new, name, types.MethodType(func, new))
        follow_moves_only(new)
    for key, value in list(vars(new).items()):
        if _is_mapping(value):
            setattr(new, key, probe_copy(value, state))
        elif isinstance(value, (list, tuple)) and any(_is_mapping(v) for v in value):
            setattr(new, key, type(value)(probe_copy(v, state) if _is_mapping(v) else v for v in value))
        elif isinstance(value, dict) and any(_is_mapping(v) for v in value.values()):
            setattr(new, key, {k: probe_copy(v, state) if _is_mapping(v) else v for k, v in value.items()})
    return new


def release(probe: Any) -> None:
    """Unbind the stub methods (and a value map's redirect) probe_copy bound onto `probe` and the copies inside it:
    each bound method refers back to its copy, a cycle only Python's cyclic collector would otherwise free."""
    for obj in nested_mappings(probe):
        attrs = getattr(obj, "__dict__", None)
        for name in (*_STUBS, "megatron_to_hf") if attrs is not None else ():
            if isinstance(attrs.get(name), types.MethodType):
                del attrs[name]


def overrides(cls: type, name: str) -> bool:
    """Whether `cls` replaces MegatronParamMapping's collective helper `name` with its own."""
    return getattr(cls, name, None) is not getattr(MegatronParamMapping, name, None)


def synthesised_all_gather(tensor_list: list[Any], tensor: Any, group: Any = None, async_op: bool = False) -> None:
    """torch.distributed.all_gather over a ProbeGroup, synthesised as the helpers are: this rank's tensor at its
    index, a shared zero placeholder at every other (the list's items replaced); over any other group it refuses."""
    state = getattr(group, "_state", None) if isinstance(group, ProbeGroup) else None
    if state is None or async_op or len(tensor_list) != group.size():
        raise ProbeCommError("probe: the mapping called torch.distributed.all_gather directly")
    rank = group.rank()
    if group.size() > 1:
        state.writer.add((group._label.removesuffix("_group"), rank))
    for i in range(len(tensor_list)):
        tensor_list[i] = tensor if i == rank else state.placeholder(tensor)


def _refuser(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise ProbeCommError(f"probe: the mapping called torch.distributed.{name} directly")

    return call


_REFUSERS = {name: _refuser(name) for name in _DIST_CALLS} | {"all_gather": synthesised_all_gather}
"""One refusing stand-in per collective, made once (the probe enters no_communication once per task)."""


@contextlib.contextmanager
def no_communication() -> Iterator[None]:
    """While active, every torch.distributed collective raises ProbeCommError (the probe must stay local)."""
    saved = {name: getattr(dist, name) for name in _DIST_CALLS if hasattr(dist, name)}
    try:
        for name in saved:
            setattr(dist, name, _REFUSERS[name])
        yield
    finally:
        for name, func in saved.items():
            setattr(dist, name, func)
