"""The HF reference forward with one top-level block's weights in memory at a time (fp32, on a chosen device).

transformers builds the model on the meta device; before each block (embedding, every layer, final norm, head) runs,
transformers' own loader (key renames, expert fusion, dtype plan) fills that block from the safetensors files, and
after it the block goes back to meta. Uses transformers 5's loading internals (core_model_loading); where they are
missing or refuse, `streamed_logits` raises and the caller loads the model whole instead.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
import transformers
from safetensors import safe_open
from torch.utils._pytree import tree_map
from transformers.utils import logging as hf_logging

from convcheck.hf.checkpoint import dtype_size
from convcheck.oracles.fp32 import named_blocks
from convcheck.rank.memory import trim

try:  # transformers 5's loading internals; without them `streamed_logits` raises and the caller loads whole
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        convert_and_load_state_dict_in_model,
        rename_source_key,
    )
    from transformers.modeling_utils import LoadStateDictConfig, _load_parameter_into_model
    from transformers.monkey_patching import patch_output_recorders
except ImportError as exc:
    _NO_STREAMING: ImportError | None = exc
else:
    _NO_STREAMING = None

MOVES_ONLY = {"MergeModulelist", "SplitModulelist", "Concatenate", "Chunk", "Transpose", "PermuteForRope"}
"""Key conversions that only move elements: converting in the stored dtype and upcasting after gives the same bits."""
STORED = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def eager() -> dict[str, str]:
    """from_pretrained's keywords for HF's reference implementations: eager attention and, where transformers has
    a choice of MoE kernels, the eager per-expert loop (one expert's weights used at a time)."""
    kinds = {"attn_implementation": "eager"}
    if hasattr(transformers.PreTrainedModel, "set_experts_implementation"):
        kinds["experts_implementation"] = "eager"
    return kinds


def lm_auto_class(config: Any) -> Any:
    """The transformers auto class whose model gives `config`'s logits: AutoModelForCausalLM, or for a
    vision-language or audio-language checkpoint it has no entry for (Qwen3-VL, Qwen2-Audio, ...)
    AutoModelForImageTextToText or AutoModelForMultimodalLM, whose model runs a text-only input through its language
    model. A checkpoint whose `architectures` names the image-text class of a config both map (Qwen3.5-VL:
    Qwen3_5ForConditionalGeneration, where AutoModelForCausalLM builds the bare Qwen3_5ForCausalLM) gets that class:
    its image inputs need the vision tower."""
    image_text = transformers.AutoModelForImageTextToText._model_mapping.get(type(config), None)
    if image_text is not None and image_text.__name__ in (getattr(config, "architectures", None) or []):
        return transformers.AutoModelForImageTextToText
    if type(config) not in transformers.AutoModelForCausalLM._model_mapping:
        for name in ("AutoModelForImageTextToText", "AutoModelForMultimodalLM"):
            auto = getattr(transformers, name, None)
            if auto is not None and type(config) in auto._model_mapping:
                return auto
    return transformers.AutoModelForCausalLM


def logits_module(model: Any) -> Any:
    """The module of `model` that maps input_ids to logits: the model itself, or for a speech-out wrapper with no
    forward of its own (Qwen2.5-Omni's and Qwen3-Omni's ForConditionalGeneration: generate() runs its thinker, then
    its talker) the thinker, the text model the bridge converts."""
    thinker = getattr(model, "thinker", None)
    if type(model).forward is torch.nn.Module.forward and isinstance(thinker, torch.nn.Module):
        return thinker
    return model


def meta_model(path: str) -> Any:
    """The fp32 causal LM of `path` as from_pretrained builds it with `eager()` kernels, parameters and persistent
    buffers on meta (non-persistent buffers such as rotary inv_freq real, initialised as from_pretrained does). Every
    sub-config is fp32 too: a vision-language wrapper's language model takes text_config's dtype, and a bf16
    text_config would make its init-time buffers bf16 (Gemma 4's embed_scale sqrt(hidden) rounded: 3e-4 on
    tiny:gemma4-vl-moe's logits)."""
    config = transformers.AutoConfig.from_pretrained(path)
    for key, value in eager().items():  # the kernels hf_logits asks from_pretrained for
        setattr(config, f"_{key}", value)
    config.dtype = torch.float32
    for name in getattr(config, "sub_configs", {}):  # from_pretrained(dtype=float32) sets every sub-config's too: a
        sub = getattr(config, name, None)  # sub-model built from a bf16 text_config makes bf16 buffers (Gemma 3's
        if sub is not None and hasattr(sub, "dtype"):  # embed_scale, modeling_gemma3.py:106)
            sub.dtype = torch.float32
    cls = transformers.models.auto.auto_factory._get_model_class(config, lm_auto_class(config)._model_mapping)
    with ExitStack() as stack:
        for context in cls.get_init_context(torch.float32, False, False, None):
            stack.enter_context(context)
        model = cls(config)
        patch_output_recorders(model)
    for key, buffer in model.named_non_persistent_buffers():
        _load_parameter_into_model(model, key, torch.empty_like(buffer, device="cpu"))
    for tensor in [*model.parameters(), *(b for b in model.buffers() if b.is_meta)]:
        tensor._is_hf_initialized = True  # initialize_weights then fills only the buffers
    model.initialize_weights()
    return model.eval()


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files from_pretrained reads: those the index names, else model.safetensors, else the only
    *.safetensors of the folder."""
    import json

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    found = sorted(folder.glob("*.safetensors"))
    if len(found) != 1:
        raise FileNotFoundError(f"no model.safetensors(.index.json) in {folder} and {len(found)} other *.safetensors")
    return found


class BlockLoader:
    """Loads one block's tensors through transformers' converter (fp32, on `device`); sends them back to meta."""

    def __init__(self, model: Any, path: str, device: str) -> None:
        self.model, self.device = model, device
        mapping = get_model_conversion_mapping(model, None, None)
        ops = {type(op).__name__ for m in mapping if isinstance(m, WeightConverter) for op in m.operations}
        if not ops <= MOVES_ONLY:
            raise NotImplementedError(f"key conversions that compute ({sorted(ops - MOVES_ONLY)})")
        self.config = LoadStateDictConfig(
            pretrained_model_name_or_path=path,
            dtype=torch.float32,
            dtype_plan=model._get_dtype_plan(torch.float32),
            weight_mapping=mapping,
        )
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
        files = _weight_files(Path(path))
        meta = model.state_dict()
        self.file_of: dict[str, str] = {}
        self.keys_of: dict[str, list[str]] = {}  # model key -> the checkpoint keys it is made from
        self.stored: dict[str, set[str]] = {}  # model key -> the stored dtypes of those keys
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    self.file_of[key] = str(file)
                    target, _ = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
                    self.keys_of.setdefault(target, []).append(key)
                    self.stored.setdefault(target, set()).add(STORED.get(handle.get_slice(key).get_dtype(), "?"))
        self.ties = dict(model.all_tied_weights_keys)  # {tied param: its source}, e.g. lm_head <- embed_tokens
        self.live: set[str] = set()  # what the last load made real

    def load(self, prefix: str, block: Any) -> None:
        """Materialise the block's parameters and persistent buffers in fp32 on the device."""
        names = {f"{prefix}.{n}" for n in block.state_dict()}
        tied = {t: s for t, s in self.ties.items() if t in names and t not in self.keys_of}
        wanted = names | set(tied.values())
        self.live = wanted
        for name in wanted:  # convert in the stored dtype (elements only move), upcast one tensor at a time after
            stored = self.stored.get(name, set())
            if len(stored) == 1 and "?" not in stored:
                dtype = getattr(torch, next(iter(stored)))
                self._set(name, torch.empty_like(self.model.get_parameter_or_buffer(name), dtype=dtype))
        handles: dict[str, Any] = {}
        slices = {}
        for key in (k for name in wanted for k in self.keys_of.get(name, [])):
            file = self.file_of[key]
            if file not in handles:
                handles[file] = safe_open(file, framework="pt", device="cpu")
            slices[key] = handles[file].get_slice(key)
        for batch in _batches(wanted, self.keys_of, slices):
            with _sequential_loads():
                info, _ = convert_and_load_state_dict_in_model(self.model, batch, self.config, tp_plan=None)
            refused = bool(info.mismatched_keys or info.conversion_errors or info.error_msgs)
            del info, batch
            if refused:
                raise RuntimeError(f"transformers could not load {prefix}")
            trim()  # the converter's staging (per-expert reads, stacks) goes back to the system
        handles.clear()
        slices.clear()
        for name in wanted:
            tensor = self.model.get_parameter_or_buffer(name)
            if not tensor.is_meta and (tensor.dtype != torch.float32 or tensor.device.type != self.device):
                moved = tensor.to(self.device)  # the stored dtype crosses to the device, the upcast happens there
                if moved.is_floating_point() and moved.dim() >= 3 and moved.dtype != torch.float32:
                    self._set(name, moved, lazy=True)  # fused experts: upcast one expert at a time, when used
                else:
                    self._set(name, moved.float() if moved.is_floating_point() else moved)
                del moved
            del tensor
        trim()  # the stored-dtype copies the upcasts replaced
        for target, source in tied.items():  # what tie_weights does after from_pretrained's load
            parent, _, attr = target.rpartition(".")
            setattr(self.model.get_submodule(parent), attr, self.model.get_parameter(source))
        missing = sorted(n for n in names if self.model.get_parameter_or_buffer(n).is_meta)
        if missing:
            raise RuntimeError(f"{prefix}: not in the checkpoint: {missing[:3]}")

    def _set(self, name: str, value: Any, lazy: bool = False) -> None:
        parent, _, attr = name.rpartition(".")
        module = self.model.get_submodule(parent)
        if attr in module._parameters:
            kind = upcast_on_use() if lazy else torch.nn.Parameter
            module._parameters[attr] = kind(value, requires_grad=False)
        else:
            module._buffers[attr] = value

    def drop(self) -> None:
        """What the last load made real (the block's tensors, a tied source) back to meta."""
        for name in self.live:
            tensor = self.model.get_parameter_or_buffer(name)
            if not tensor.is_meta:
                dtype = torch.float32 if isinstance(tensor, upcast_on_use()) else tensor.dtype
                self._set(name, torch.empty(tensor.shape, dtype=dtype, device="meta"))
        self.live = set()
        trim()  # the block's memory goes back to the system before the next block loads


_UPCAST: list[Any] = []
_METADATA = {"__get__", "dim", "size", "numel", "is_floating_point", "__len__", "data_ptr", "stride", "is_contiguous"}
"""Uses that read no values (attribute getters, sizes): answered from the stored tensor, nothing upcast."""


def upcast_on_use() -> Any:
    """The Parameter class whose stored-dtype data reads as fp32: an indexed slice (one expert of a fused expert
    tensor) is upcast alone, any other use upcasts the whole (exact either way: upcasting is exact)."""
    if not _UPCAST:

        class UpcastOnUse(torch.nn.Parameter):
            @classmethod
            def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                with torch._C.DisableTorchFunctionSubclass():
                    if func is torch.Tensor.__getitem__ and isinstance(args[0], cls):
                        return func(*args, **kwargs).float()
                    if getattr(func, "__self__", None) is torch.Tensor.dtype:  # the dtype getter
                        return torch.float32  # what it reads as
                    if getattr(func, "__name__", "") in _METADATA:  # shape, device, is_meta, dim(), size() ...
                        return func(*args, **kwargs)
                    up = tree_map(lambda t: t.float() if isinstance(t, cls) else t, (args, kwargs))
                    return func(*up[0], **up[1])

        _UPCAST.append(UpcastOnUse)
    return _UPCAST[0]


ALONE_BYTES = 64 << 20
"""A parameter whose checkpoint tensors hold at least this many bytes is converted by a loader call of its own,
largest first: the converter's staging (stacked experts, then gate and up concatenated) then never overlaps
another large parameter's, nor sits next to parameters loaded before it."""


def _batches(wanted: set[str], keys_of: dict[str, list[str]], slices: dict[str, Any]) -> list[dict[str, Any]]:
    """The block's checkpoint slices in loader calls: each large parameter's alone (largest first), then the rest."""
    import math

    def size(name: str) -> int:
        keys = keys_of.get(name, [])
        return sum(math.prod(slices[k].get_shape()) * (dtype_size(slices[k].get_dtype()) or 4) for k in keys)

    large = sorted((n for n in wanted if size(n) >= ALONE_BYTES), key=size, reverse=True)
    rest = {k: slices[k] for n in sorted(wanted - set(large)) for k in keys_of.get(n, [])}
    calls = [{k: slices[k] for k in keys_of[n]} for n in large]
    return calls + [rest] if rest else calls


@contextmanager
def _sequential_loads() -> Iterator[None]:
    """The loader reads a block's tensors one by one instead of on its thread pool (same bits; on Qwen3-30B-A3B dims
    the pool's parallel reads cost 0.7 GB more at peak, for no measurable time)."""
    saved = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
    os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HF_DEACTIVATE_ASYNC_LOAD", None)
        else:
            os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = saved


def streamed_logits(path: str, tokens: Any, device: str = "cpu") -> Any:
    """fp32 logits [B, S, V] (CPU) of the eager HF model at `path`, run on `device` one loaded block at a time."""
    if _NO_STREAMING is not None:
        raise NotImplementedError(f"this transformers has no loader to stream blocks with: {_NO_STREAMING}")
    model = meta_model(path)
    blocks = named_blocks(model)
    inside = {f"{prefix}.{n}" for prefix, block in blocks for n, _ in block.named_parameters()}
    outside = [n for n, _ in model.named_parameters() if n not in inside]
    if outside:
        raise NotImplementedError(f"parameters outside every block: {outside[:3]}")
    loader = BlockLoader(model, path, torch.device(device).type)
    for module in model.modules():  # the real non-persistent buffers follow the run's device
        for attr in module._non_persistent_buffers_set:
            if module._buffers.get(attr) is not None:
                module._buffers[attr] = module._buffers[attr].to(device)
    handles = []
    for prefix, block in blocks:
        handles.append(block.register_forward_pre_hook(lambda m, _a, p=prefix: loader.load(p, m)))
        handles.append(block.register_forward_hook(lambda _m, _a, _o: loader.drop()))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the loader would print a bar per block
    try:
        with torch.no_grad():
            return logits_module(model)(input_ids=tokens.to(device)).logits.float().cpu()
    finally:
        for handle in handles:
            handle.remove()
        loader.drop()
        if bars:
            hf_logging.enable_progress_bar()
