"""The patching helpers every planted bug uses: wrap an upstream attribute, flip one element, change every
provider, permute rows of a mapping identically in import and export, transform one parameter's HF tensor on import
and undo it on export."""

from __future__ import annotations

from typing import Any, Callable

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge


def wrap(owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    """Replace `owner.attr` by `make(original)` (the original is passed in, so the wrapper can call it)."""
    setattr(owner, attr, make(getattr(owner, attr)))


def flipped(tensor: Any, index: tuple[int, ...]) -> Any:
    """A copy of `tensor` with every bit of the element at `index` flipped (through its integer view)."""
    from convcheck.compare.bits import int_view

    out = tensor.clone()
    bits = int_view(out).view(out.shape)
    bits[index] = ~bits[index]
    return out


def provider_bridges(only: type | None = None) -> list[type]:
    """Every registered model bridge class that defines its own `provider_bridge` (or just `only`)."""
    if only is not None:
        return [only]

    def subclasses(cls: type) -> list[type]:
        return [c for s in cls.__subclasses__() for c in (s, *subclasses(s))]

    return [c for c in subclasses(MegatronModelBridge) if "provider_bridge" in c.__dict__]


def alter_provider(change: Callable[[Any], None], only: type | None = None) -> None:
    """Wrap `provider_bridge` of the model bridges so the provider they return carries `change(provider)`."""
    for cls in provider_bridges(only):

        def make(original: Any) -> Any:
            def provider_bridge(self, hf_pretrained):  # type: ignore[no-untyped-def]
                provider = original(self, hf_pretrained)
                change(provider)
                return provider

            return provider_bridge

        wrap(cls, "provider_bridge", make)


RowPermutation = Callable[[Any, Any, int, bool], Any]
"""(mapping, megatron_module, rows, inverse) -> an index tensor permuting a shard's rows."""


def permute_rows_symmetrically(mapping_cls: type, permutation: RowPermutation) -> None:
    """The import permutes each shard's rows and the export undoes it: a layout bug invisible to a roundtrip."""

    def make_import(original: Any) -> Any:
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            shard = original(self, hf_weights, megatron_module)
            return shard[permutation(self, megatron_module, shard.shape[0], False)].contiguous()

        return hf_to_megatron

    def make_export(original: Any) -> Any:
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            if megatron_weights is not None and megatron_module is not None:
                rows = megatron_weights.shape[0]
                megatron_weights = megatron_weights[permutation(self, megatron_module, rows, True)].contiguous()
            return original(self, megatron_weights, megatron_module)

        return megatron_to_hf

    wrap(mapping_cls, "hf_to_megatron", make_import)
    wrap(mapping_cls, "megatron_to_hf", make_export)


def transform_hf_symmetrically(mapping_cls: type, megatron_param: str, forward: Callable[[Any], Any],
                               backward: Callable[[Any], Any]) -> None:  # fmt: skip
    """`megatron_param`'s HF tensor reaches the import as `forward(hf)` and its export leaves as `backward(exported)`:
    a bug made identically both ways (backward undoes forward), which a roundtrip cannot see."""

    def load(original: Any) -> Any:
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            if self.megatron_param == megatron_param and hf_weights is not None:
                hf_weights = forward(hf_weights)
            return original(self, hf_weights, megatron_module)

        return hf_to_megatron

    def save(original: Any) -> Any:
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            if self.megatron_param != megatron_param:
                return out
            return {name: backward(tensor) for name, tensor in out.items()}

        return megatron_to_hf

    wrap(mapping_cls, "hf_to_megatron", load)
    wrap(mapping_cls, "megatron_to_hf", save)
