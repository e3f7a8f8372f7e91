"""`verify --spec te`: the layer specs production trains with, built on a host without Transformer Engine (shim 26).

Without TE, megatron-core's TE extension still defines its TE class names, bound to placeholders (MagicMock
subclasses, a TENorm that raises, None for the grouped linears: megatron/core/extensions/transformer_engine.py:69-79,
:796, :2715-2717), and the spec modules leave the TE backend None or unbound (models/gpt/gpt_layer_specs.py:54, so
:233 `TESpecProvider()` raises 'NoneType' object is not callable; experimental_attention_variant_module_specs.py:43).
Shim 26 binds convcheck.kernels.te's stand-ins where those names are looked up, and nowhere else:

- the extension module's own names (what a later `from ... import TENorm` or the bridge's `safe_import_from` gets);
- every already-imported megatron module holding one of the extension's placeholder objects under that name
  (identity, so only copies of the placeholders: transformer_engine_spec_provider.py:8-18, hybrid_block.py:19,
  hybrid_layer_specs.py:4, the bridge's te_layers.py:22-23, gemma3_provider.py:47-51, ...), and every megatron-core
  module that binds the name to None without TE (the grouped names in transformer_engine_spec_provider.py:8-18 and
  backends.py:9-12; multi_latent_attention.py:61-78, whose MLA spec check compares against them at :525);
- `TESpecProvider` where the spec modules left it None or unbound (gpt_layer_specs.py:54,
  experimental_attention_variant_module_specs.py:43) and `TENorm` in gpt_layer_specs.py:54;
- the TE version the spec provider checks (transformer_engine_spec_provider.py:63, :87: TE 2.20.2, the release the
  stand-in follows) and the final norm of a block built from a layer spec (transformer/transformer_block.py:64,
  `LayerNormImpl`: TENorm where TE is installed);
- the classes megatron-core and the bridge derive from a TE class (the bridge's `TERowParallelLinearLayerNorm`,
  common/te_layers.py:26, used by Gemma 2 / Gemma 3 / EXAONE 4; `Gemma3TEDotProductAttention`,
  gemma3_provider.py:233; Ministral's, MiMo's, Gemma 4's attention, ...). Without TE their `class X(TEBase):` statement
  ran with a MagicMock as the base, so Python handed the class body to `MagicMock(name, bases, namespace)` and bound X
  to a mock (which keeps the body as its return value and the bases as its side effect): each is built again as a
  class from its own unmodified body, on the stand-in of its base, and bound wherever the mock was.

`HAVE_TE` stays False everywhere and nothing enters sys.modules: megatron-core takes no other TE-only path (fp8,
te_checkpoint, the op fuser, TE's fused kernels), which the stand-in does not compute. Installed only in a run that
asks for `--spec te`, only while TE is missing.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any
from unittest.mock import NonCallableMock

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.model_provider import ModelProviderMixin

from convcheck.compat.detect import optional_module, skip
from convcheck.compat.no_te import transformer_engine_available

SPECS = ("local", "te")
"""Values of `verify --spec`: megatron-core's local layer spec (default) or the TE specs on the stand-in."""

TE_EXTENSION = "megatron.core.extensions.transformer_engine"
SPEC_PROVIDER = "megatron.core.extensions.transformer_engine_spec_provider"
NONE_BOUND = "megatron.core."
"""Where a TE class name bound to None means "TE is missing" (megatron-core's `if HAVE_TE: from ... else: None`)."""
TE_SPEC_MODULES = (
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.models.gpt.experimental_attention_variant_module_specs",
)
"""Spec modules that bind TESpecProvider (and TENorm) only when TE imports."""
BLOCK = "megatron.core.transformer.transformer_block"

_INSTALLED: dict[str, Any] = {}


# --- Shim 26 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2: models/gpt/gpt_layer_specs.py:54 binds TESpecProvider and TENorm to None without TE (:233
# then raises 'NoneType' object is not callable); extensions/transformer_engine_spec_provider.py:8-18 copies the
# extension's placeholders; transformer/transformer_block.py:64 builds a layer spec's final norm with WrappedTorchNorm;
# experimental_attention_variant_module_specs.py:43 leaves TESpecProvider unbound; megatron-core 0.16's
# gpt_layer_specs.py binds neither TENorm nor TESpecProvider without TE (its `except ImportError` sets only HAVE_TE;
# MLA's TE spec then raises NameError at :527). While TE is missing and the run asks
# for `--spec te`, the names are bound to convcheck.kernels.te's stand-ins as the module docstring lists. Feature
# detection: skipped (shim 26 in compat.skipped()) where the extension or its TESpecProvider is absent.


def te_min_version(version: str, check_equality: bool = True) -> bool:
    """megatron-core's is_te_min_version, answered for the TE release the stand-in follows."""
    from packaging.version import Version

    from convcheck.kernels.te import TE_VERSION

    return Version(TE_VERSION) >= Version(version) if check_equality else Version(TE_VERSION) > Version(version)


def te_version() -> Any:
    """megatron-core's get_te_version for the stand-in."""
    from packaging.version import Version

    from convcheck.kernels.te import TE_VERSION

    return Version(TE_VERSION)


def install_te_standin() -> dict[str, list[str]]:
    """Install shim 26 (idempotent) while TE is missing; returns {module: [names bound there]}."""
    if "bound" in _INSTALLED:
        return _INSTALLED["bound"]
    if transformer_engine_available():
        return {}
    extension = optional_module(TE_EXTENSION)
    provider = optional_module(SPEC_PROVIDER)
    if extension is None or provider is None or not hasattr(provider, "TESpecProvider"):
        skip(25, "this megatron-core has no TE extension with a TESpecProvider")
        return {}
    from convcheck.kernels.te import STAND_INS, TENorm

    for name in TE_SPEC_MODULES + (BLOCK, "megatron.core.models.backends"):
        optional_module(name)
    placeholders = {name: extension.__dict__.get(name) for name in STAND_INS}
    bound: dict[str, list[str]] = {}

    def bind(module: Any, name: str, value: Any) -> None:
        setattr(module, name, value)
        bound.setdefault(module.__name__, []).append(name)

    for name, cls in STAND_INS.items():
        bind(extension, name, cls)
    for module_name, module in list(sys.modules.items()):
        if module is None or module is extension or not module_name.startswith("megatron."):
            continue
        names = getattr(module, "__dict__", {})
        for name, cls in STAND_INS.items():
            if name not in names:
                continue
            held = names[name]
            if (held is not None and held is placeholders[name]) or (
                held is None and module_name.startswith(NONE_BOUND)
            ):
                bind(module, name, cls)
    for module_name in TE_SPEC_MODULES:
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, "TESpecProvider", None) is None:
            bind(module, "TESpecProvider", provider.TESpecProvider)
        if module is not None and module.__dict__.get("TENorm") is None:  # None, or never bound (0.16's except)
            bind(module, "TENorm", TENorm)
    bind(provider, "is_te_min_version", te_min_version)
    bind(provider, "get_te_version", te_version)
    block = sys.modules.get(BLOCK)
    if block is not None and getattr(block, "LayerNormImpl", None) is not placeholders["TENorm"]:
        bind(block, "LayerNormImpl", TENorm)
    rebuild_derived_classes(placeholders, bind)
    _INSTALLED["bound"] = bound
    return bound


def class_statement_mock(value: Any) -> bool:
    """True for what `class X(base):` binds when `base` is a MagicMock: a mock called as a metaclass with
    (name, bases, namespace), spec'd on the name (a str), the namespace dict its return value."""
    if not isinstance(value, NonCallableMock) or value.__dict__.get("_spec_class") is not str:
        return False
    namespace = value.__dict__.get("_mock_return_value")
    return isinstance(namespace, dict) and "__qualname__" in namespace and "__module__" in namespace


def _statement_bases(value: Any) -> tuple[Any, ...]:
    """The bases a class statement passed to the mock (its side effect, an iterator over them: read whole through
    the iterator's reduction, whatever a call consumed)."""
    effect = value.__dict__.get("_mock_side_effect")
    reduced = effect.__reduce__() if effect is not None else None
    return tuple(reduced[1][0]) if reduced and reduced[1] else ()


def rebuild_derived_classes(placeholders: dict[str, Any], bind: Any) -> dict[int, type]:
    """Build again, as real classes, every class statement in a megatron module whose base chain reaches a TE
    placeholder (see the module docstring), each from its own namespace on the stand-ins; bind each wherever its mock
    was. Returns {id(mock): class}. A chain through anything else (a bare `te.pytorch.X` attribute) stays a mock."""
    from convcheck.kernels.te import STAND_INS

    stand_in = {id(held): STAND_INS[name] for name, held in placeholders.items() if held is not None}
    built: dict[int, type | None] = {}

    def rebuild(value: Any) -> type | None:
        if id(value) in stand_in:
            return stand_in[id(value)]
        if not class_statement_mock(value):
            return value if isinstance(value, type) else None
        if id(value) not in built:
            built[id(value)] = None  # a cycle cannot occur, but never recurse twice
            bases = tuple(rebuild(base) for base in _statement_bases(value))
            if bases and all(base is not None for base in bases):
                namespace = dict(value.__dict__["_mock_return_value"])
                built[id(value)] = type(namespace["__qualname__"].rsplit(".", 1)[-1], bases, namespace)
        return built[id(value)]

    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("megatron."):
            continue
        for name, held in list(getattr(module, "__dict__", {}).items()):
            if id(held) in stand_in or not class_statement_mock(held):
                continue
            cls = rebuild(held)
            if cls is not None:
                bind(module, name, cls)
    return {key: cls for key, cls in built.items() if cls is not None}


HYBRID_TE_SPECS = (
    ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"),  # megatron-core >= 0.18
    ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"),  # megatron-core 0.16-0.17
    ("megatron.core.ssm.mamba_layer_specs", "mamba_stack_spec"),  # older megatron-core
)
"""Where a release builds its hybrid TE stack spec as a module-level value (module, name), newest first."""


def te_hybrid_stack_spec() -> Any:
    """megatron-core's hybrid TE stack spec (hybrid_layer_specs.py:90), built again from its own source once shim 26
    bound the stand-ins: the module builds it when imported, before anything can be bound, so the imported copy holds
    the placeholders (and SequentialMLP experts, TESpecProvider then seeing no grouped linear). The fresh copy of the
    module is not registered in sys.modules."""
    if "hybrid" not in _INSTALLED:
        install_te_standin()
        for name, attr in HYBRID_TE_SPECS:
            found = importlib.util.find_spec(name) if optional_module(name) is not None else None
            if found is None or found.loader is None:
                continue
            fresh = importlib.util.module_from_spec(found)
            found.loader.exec_module(fresh)
            _INSTALLED["hybrid"] = getattr(fresh, attr)
            break
        else:
            raise RuntimeError("this megatron-core has no hybrid TE stack spec")
    return _INSTALLED["hybrid"]


TE_STACK_SPECS = (
    ("falconh1_stack_spec", "megatron.bridge.models.falcon_h1.modeling_falconh1.falconh1_layer_specs",
     "falconh1_stack_spec", "megatron.bridge.models.falcon_h1.falconh1_provider", "get_default_falconh1_stack_spec"),
)  # fmt: skip
"""Bridge providers whose default stack spec is a module-level value built from TE classes when its module is
imported (before shim 26 can bind anything): (provider field, spec module, spec name, module of the default getter,
its name). megatron-bridge 0.6.2 models/falcon_h1/modeling_falconh1/falconh1_layer_specs.py:33 (TENorm,
TELayerNormColumnParallelLinear, ... in FalconH1's layer and stack spec), falconh1_provider.py:35 and :108."""


def te_module_spec(module_name: str, attr: str) -> Any:
    """`attr` of `module_name` built again from the module's own source once shim 26 bound the stand-ins (the
    imported copy holds the placeholders); the fresh copy of the module is not registered in sys.modules."""
    key = f"spec:{module_name}:{attr}"
    if key not in _INSTALLED:
        install_te_standin()
        found = importlib.util.find_spec(module_name) if optional_module(module_name) is not None else None
        if found is None or found.loader is None:
            raise RuntimeError(f"this megatron-bridge has no {module_name}")
        fresh = importlib.util.module_from_spec(found)
        found.loader.exec_module(fresh)
        _INSTALLED[key] = getattr(fresh, attr)
    return _INSTALLED[key]


def bind_te_stack_specs(provider: ModelProviderMixin) -> list[str]:
    """Give `provider` the stand-in copy of its default TE stack spec (TE_STACK_SPECS) where it holds the default
    (the getter or the imported spec); a spec the caller set is kept. Returns the fields set."""
    done = []
    for field_name, module_name, attr, getter_module, getter in TE_STACK_SPECS:
        value = getattr(provider, field_name, None)
        if value is None:
            continue
        spec_module, default_module = optional_module(module_name), optional_module(getter_module)
        defaults = (getattr(spec_module, attr, None), getattr(default_module, getter, None))
        if any(value is d for d in defaults if d is not None):
            setattr(provider, field_name, te_module_spec(module_name, attr))
            done.append(field_name)
    return done


def te_standin_installed() -> bool:
    """True once shim 26 bound the stand-ins in this process."""
    return bool(_INSTALLED.get("bound"))
