"""Reference receivers for the receiver and idempotence oracles: `hf` (a transformers model) and `fused` (pure torch,
stacked parameters as inference engines load them).

The receiver contract (README, "Weight-sync paths"): `CLASS(config=<transformers config>)`, `load_weights(iterable
of (hf_name, tensor))` callable piecewise in any order, `state_dict()` or `named_parameters()` to read the state
back, and optionally `expected(hf)` (what the state holds after a full sync), `sources(param, hf_names)` and
`locate(param, index)` (which HF tensors and element feed a parameter, for findings).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import transformers

from convcheck.errors import NotCovered
from convcheck.sync.fusion import Geometry, locate, one_layout_gap, pack, slot_of, sources_of

try:  # transformers 5; older releases' transformers have no weight conversions (using them raises as it did)
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import Transpose, WeightConverter, revert_weight_conversion

    HAVE_CONVERSIONS = True
except ImportError as _missing:
    HAVE_CONVERSIONS = False
    _NO_CONVERSIONS = _missing

    def revert_weight_conversion(model: Any, state: Any) -> Any:
        raise _NO_CONVERSIONS


def shape_checked_transposes(model: Any) -> list[re.Pattern[str]]:
    """Name patterns of the checkpoint tensors transformers' loader transposes only when their shape is not the
    model's (`Transpose(check_dims=True)`, e.g. Qwen3-VL-MoE's fused experts, conversion_mapping.py:838): published
    checkpoints store them [E, H, 2F], transformers 5 holds and saves [E, 2F, H]; the loader takes either."""
    if not HAVE_CONVERSIONS:
        return []
    patterns = []
    for transform in get_model_conversion_mapping(model, add_legacy=False):
        if isinstance(transform, WeightConverter) and any(
            isinstance(op, Transpose) and op.check_dims for op in transform.operations
        ):
            patterns += [re.compile(re.escape(p).replace(r"\*", r"\d+")) for p in transform.source_patterns]
    return patterns


REMOVED_PREFIXES = (".vision_model.",)
"""Name segments transformers' loader removes from a checkpoint name (SiglipVisionModel's and CLIPVisionModel's
PrefixChange(prefix_to_remove="vision_model"), transformers 5.12.1 conversion_mapping.py:76, :607), so
`vision_tower.vision_model.X` loads as `vision_tower.X`."""


def unprefixed(name: str) -> str:
    """`name` with the first REMOVED_PREFIXES segment dropped (`a.vision_model.b` -> `a.b`); unchanged without one."""
    for segment in REMOVED_PREFIXES:
        if segment in name:
            return name.replace(segment, ".", 1)
    return name


class HFReceiver:
    """The checkpoint's transformers model class, built on the meta device and materialised on the CPU in the
    checkpoint's dtype; reads its state back under checkpoint names through transformers' own save-time conversion
    (so fused MoE experts show as per-expert tensors), tied weights under each of their names.

    Loading writes each element where transformers' conversion mapping places it (found once by converting a tensor
    of element positions), with `copy_`, as transformers' loader does.
    """

    def __init__(self, config: Any) -> None:
        cls = getattr(transformers, config.architectures[0])
        dtype = getattr(config, "dtype", None) or torch.float32
        with torch.device("meta"):
            self.model = cls._from_config(config, dtype=dtype)
        self.model.to_empty(device="cpu")
        _keep_in_fp32(self.model, dtype)
        self.model.tie_weights()
        self._storage, self._placement = self._placements()
        index = {id(tensor): i for i, (_, tensor) in enumerate(self._storage)}
        self._held = {
            name: index[id(tensor)]
            for name, tensor in [*self.model.named_parameters(remove_duplicate=False), *self.model.named_buffers()]
            if id(tensor) in index and name not in self._placement
        }
        """The model's own names that no checkpoint name reverts to (fused MoE experts the conversion mapping splits
        per expert on save): transformers' loader loads a checkpoint tensor of that name as it is."""
        self.loaded_as_held: set[str] = set()
        """Names received under the model's own name (e.g. Qwen3.6's published fused experts), not a checkpoint one."""
        self._depth = config.num_hidden_layers if getattr(config, "num_nextn_predict_layers", 0) else None
        self._ignored = [re.compile(p) for p in getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or ()]
        self._checked_transposes = shape_checked_transposes(self.model)
        self.transposed: set[str] = set()
        """Names received in the other orientation of a shape-checked transpose, loaded transposed as transformers'
        loader loads them; read back in the orientation they came in."""
        self.not_held: set[str] = set()
        """MTP tensors received and dropped: transformers builds no MTP module (DeepSeek-V3, GLM-4.7-Flash, Qwen3-Next,
        Qwen3.5)."""
        self.aliases: dict[str, str] = {}
        """Received name -> the checkpoint name it was loaded as: a name under a prefix transformers' loader removes
        (`vision_tower.vision_model.*` of published Gemma 3 checkpoints, loaded as `vision_tower.*`: SiglipVisionModel's
        PrefixChange, conversion_mapping.py:607 with :76); read back under the name it came in."""

    def _is_mtp(self, name: str) -> bool:
        """`model.layers.{L + k}.*` of a model with MTP layers (L = num_hidden_layers), which no HF parameter holds, or
        a name the HF class's loader drops as unexpected (`^mtp.*` for Qwen3-Next / Qwen3.5)."""
        layer = name.split(".")[2] if name.startswith("model.layers.") else ""
        if self._depth is not None and layer.isdigit() and int(layer) >= self._depth:
            return True
        return any(p.search(name) for p in self._ignored)

    def _placements(self) -> tuple[list[tuple[str, Any]], dict[str, tuple[tuple[int, ...], list[Any]]]]:
        """Unique storages (model name, tensor) and, per checkpoint name, its shape and (storage, source, target)
        index pieces: a slice start where the target elements are contiguous, else an index tensor."""
        keys = set(self.model.state_dict())
        storage: list[tuple[str, Any]] = []
        positions: dict[str, Any] = {}
        seen: dict[int, Any] = {}
        offset = 0
        named = list(self.model.named_parameters(remove_duplicate=False)) + list(self.model.named_buffers())
        for name, tensor in named:
            if name not in keys:
                continue
            if id(tensor) not in seen:
                seen[id(tensor)] = torch.arange(offset, offset + tensor.numel(), dtype=torch.int64).reshape(
                    tensor.shape
                )
                storage.append((name, tensor))
                offset += tensor.numel()
            positions[name] = seen[id(tensor)]
        starts = torch.tensor([0] + [t.numel() for _, t in storage]).cumsum(0)
        placement = {}
        for name, where in revert_weight_conversion(self.model, positions).items():
            flat = where.reshape(-1)
            owner = torch.searchsorted(starts, flat, right=True) - 1
            pieces = []
            for index in owner.unique().tolist():
                source = (owner == index).nonzero().reshape(-1)
                target = flat[source] - starts[index]
                contiguous = bool((target.diff() == 1).all()) and bool((source.diff() == 1).all())
                if contiguous:
                    pieces.append((index, int(source[0]), int(target[0]), target.numel()))
                else:
                    pieces.append((index, source, target, None))
            placement[name] = (tuple(where.shape), pieces)
        return storage, placement

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Write each (checkpoint name, tensor) into the model; an unknown name or a wrong shape raises (an MTP
        layer's tensor is dropped, as transformers' loader drops it, and noted in `not_held`)."""
        with torch.no_grad():
            for name, tensor in weights:
                if name not in self._placement and self._is_mtp(name):
                    self.not_held.add(name)
                    continue
                if name not in self._placement and name in self._held:
                    target = self._storage[self._held[name]][1]
                    if tuple(tensor.shape) != tuple(target.shape):
                        raise ValueError(f"{name}: shape {list(tensor.shape)}, the model expects {list(target.shape)}")
                    target.data.copy_(tensor.detach())
                    self.loaded_as_held.add(name)
                    continue
                if name not in self._placement and unprefixed(name) in self._placement:
                    self.aliases[name] = unprefixed(name)
                if name not in self._placement and name not in self.aliases:
                    raise KeyError(f"{name!r} is not a tensor of {type(self.model).__name__}")
                shape, pieces = self._placement[self.aliases.get(name, name)]
                if tuple(tensor.shape) != shape and self._flips(name, tensor, shape):
                    tensor = tensor.transpose(1, 2).contiguous()
                    self.transposed.add(name)
                if tuple(tensor.shape) != shape:
                    raise ValueError(f"{name}: shape {list(tensor.shape)}, the model expects {list(shape)}")
                source = tensor.detach().reshape(-1)
                for index, src, dst, count in pieces:
                    target = self._storage[index][1].data.view(-1)
                    if count is not None:
                        target[dst : dst + count].copy_(source[src : src + count])
                    else:
                        target[dst] = source[src].to(target.dtype)

    def _flips(self, name: str, tensor: Any, shape: tuple[int, ...]) -> bool:
        """Whether transformers' loader transposes this [E, a, b] tensor into the model's [E, b, a]."""
        flipped = (*tensor.shape[:1], *tensor.shape[1:][::-1])
        return tensor.dim() == 3 and flipped == shape and any(p.search(name) for p in self._checked_transposes)

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        """The model's own storage (model names, each tied tensor once): what the oracles fill before a sync."""
        return iter(self._storage)

    def state_dict(self) -> dict[str, Any]:
        """The state under checkpoint names, as transformers would save it; a tensor received transposed (see
        `transposed`) in the orientation it came in."""
        state = revert_weight_conversion(self.model, self.model.state_dict())
        state = {k: v.transpose(1, 2).contiguous() if k in self.transposed else v for k, v in state.items()}
        if self.loaded_as_held:  # those storages read back under the name they came in, not split per expert
            held = {self._held[name] for name in self.loaded_as_held}
            state = {k: v for k, v in state.items() if not all(p[0] in held for p in self._placement[k][1])}
            state.update({name: self._storage[self._held[name]][1] for name in self.loaded_as_held})
        for received, placed in self.aliases.items():
            state[received] = state.pop(placed)
        return state

    def expected(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        """Every checkpoint name holds its source tensor; a tied name absent from the source holds its twin's."""
        out = {}
        by_place: dict[Any, list[str]] = {}
        for name, (_, pieces) in self._placement.items():
            if all(count is not None for *_, count in pieces):
                by_place.setdefault(tuple(pieces), []).append(name)
        out.update({name: hf[name] for name in self._held if name in hf})
        prefixed = {unprefixed(name): name for name in hf if unprefixed(name) != name}
        for name, (_, pieces) in self._placement.items():
            if name in hf:
                out[name] = hf[name]
                continue
            if name in prefixed:  # the source names it under a prefix the loader removes
                out[prefixed[name]] = hf[prefixed[name]]
                continue
            twins = by_place.get(tuple(pieces), []) if all(c is not None for *_, c in pieces) else []
            source = next((t for t in twins if t in hf), None)
            if source is not None:
                out[name] = hf[source]
        return out


def _keep_in_fp32(model: Any, dtype: Any) -> None:
    """Upcast what from_pretrained keeps in float32 (`_keep_in_fp32_modules_strict`, e.g. DeepSeek-V3's
    e_score_correction_bias), which `_from_config` builds in `dtype`."""
    import re

    plan = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
    if not plan:
        return
    for prefix, module in model.named_modules():
        for slots in (module._parameters, module._buffers):
            for name, tensor in list(slots.items()):
                full = f"{prefix}.{name}" if prefix else name
                target = next((t for pattern, t in plan.items() if re.search(pattern, full)), None)
                if tensor is None or target is None or tensor.dtype == target:
                    continue
                kept = tensor.detach().to(target)
                slots[name] = type(tensor)(kept, requires_grad=False) if slots is module._parameters else kept


class FusedReceiver:
    """An inference engine's stacked parameters in pure torch (vLLM's / SGLang's loading pattern, sync.fusion).

    Each fused parameter is allocated NaN-filled when its first piece arrives and written piecewise by row range, in
    whatever order names arrive; every other tensor is kept as it comes (copied in place from the second load on).
    """

    def __init__(self, config: Any) -> None:
        gap = one_layout_gap(config)
        if gap is not None:
            raise NotCovered(f"convcheck's fused receiver stacks one q / k / v layout for every layer, and {gap} (a "
                             "--receiver of the engine's own covers it)")  # fmt: skip
        self.geometry = Geometry.from_config(config)
        self.params: dict[str, Any] = {}

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Load (hf_name, tensor) pairs, fused ones into their slot; a piece that does not fit raises."""
        with torch.no_grad():
            for name, tensor in weights:
                slot = slot_of(name, self.geometry)
                if slot is None:
                    self._load_plain(name, tensor)
                else:
                    self._region(name, slot, tensor).copy_(tensor)

    def _load_plain(self, name: str, tensor: Any) -> None:
        param = self.params.get(name)
        if param is None or tuple(param.shape) != tuple(tensor.shape):
            self.params[name] = tensor.detach().cpu().clone()
        else:
            param.copy_(tensor)

    def _region(self, name: str, slot: Any, tensor: Any) -> Any:
        """The view of the fused parameter that `tensor` (HF tensor `name`) fills, allocated on first use."""
        rows = tensor.shape[0]
        parts = 2 if self.geometry.gated else 1
        qkv, z, heads = self.geometry.gdn_rows
        part_rows = {"q": self.geometry.q_rows, "k": self.geometry.kv_rows, "v": self.geometry.kv_rows, "qkv": qkv,
                     "z": z, "b": heads, "a": heads}  # fmt: skip
        if slot.expert is None:
            totals = {"q": self.geometry.q_rows + 2 * self.geometry.kv_rows, "qkv": qkv + z, "b": 2 * heads}
            total = totals.get({"k": "q", "v": "q", "z": "qkv", "a": "b"}.get(slot.shard, slot.shard), 2 * rows)
            shape = (total, *tensor.shape[1:])
        elif slot.shard == "w2":
            shape = (self.geometry.experts, *tensor.shape)
        else:
            shape = (self.geometry.experts, parts * rows, *tensor.shape[1:])
        param = self._allocate(slot.param, shape, tensor.dtype)
        target = param if slot.expert is None else param[slot.expert]
        start = rows if slot.row_start is None else slot.row_start
        region = target[start : start + rows]
        if tuple(region.shape) != tuple(tensor.shape) or part_rows.get(slot.shard, rows) != rows:
            raise ValueError(
                f"{name}: shape {list(tensor.shape)} does not fit rows {start}.. of {slot.param} {list(param.shape)}"
            )
        return region

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        param = self.params.get(name)
        if param is None:
            param = torch.empty(shape, dtype=dtype)
            param.fill_(float("nan") if param.is_floating_point() else 0)
            self.params[name] = param
        elif tuple(param.shape) != tuple(shape):
            raise ValueError(f"{name}: a piece implies shape {list(shape)}, the parameter is {list(param.shape)}")
        return param

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        return iter(sorted(self.params.items()))

    def expected(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        """The source tensors packed the way this engine stacks them (torch.cat / torch.stack of whole tensors)."""
        return pack(hf, self.geometry)

    def sources(self, param: str, hf_names: list[str]) -> list[str]:
        return sources_of(param, hf_names, self.geometry)

    def locate(self, param: str, index: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
        shape = tuple(self.params[param].shape) if param in self.params else ()
        return locate(param, shape, index, self.geometry)
