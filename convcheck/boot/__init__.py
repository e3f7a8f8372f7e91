"""Imported before megatron.bridge by every convcheck module that imports it (`import convcheck.boot` first: the
ruff isort section `boot` keeps it above the third-party imports): installs shim 1, the Transformer Engine import
stand-in, so the bridge imports where TE is not installed. Nothing else; pure Python, no heavy library.

Shim 1 stays listed with the other shims in convcheck.compat.SHIMS (its tests: tests/test_compat.py)."""

from __future__ import annotations

import ast
import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any


def transformer_engine_available() -> bool:
    """True when the real Transformer Engine can be imported (then no TE shim is installed)."""
    return importlib.util.find_spec("transformer_engine") is not None


# megatron-bridge 0.6.2, megatron/bridge/peft/lora_layers.py:20 does `import transformer_engine.pytorch as te`
# unconditionally (reached from auto_bridge.py:40 -> model_bridge.py:56 -> conversion/peft_bridge.py:41 ->
# peft/canonical_lora.py:26); bridge 0.3.0-0.5.1 also do it in peft/lora.py:21-22 (reached from peft_bridge.py:42).
# Module-level uses are annotations and class comparisons only (te.ops.Sequential, te.Linear). We give ONLY those
# modules an inert stand-in through a private __import__ while their body executes; nothing enters sys.modules, so
# megatron.core keeps HAVE_TE=False. Feature detection: a module gets it only when its source imports
# transformer_engine at module level (outside try/except).
TE_IMPORTERS = ("megatron.bridge.peft.lora_layers", "megatron.bridge.peft.lora")
"""Bridge modules seen importing Transformer Engine unconditionally (lora_layers: 0.3.0-0.6.2, lora: 0.3.0-0.5.1)."""
LORA_LAYERS_MODULE = TE_IMPORTERS[0]


class _InertTE(types.ModuleType):
    """Stand-in for transformer_engine attributes used at import time; any call fails loudly."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _InertTE(f"{self.__name__}.{name}")
        setattr(self, name, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__} is convcheck's inert Transformer Engine stand-in; TE is not installed")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


def _te_stand_in_import(name: str, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and (name == "transformer_engine" or name.startswith("transformer_engine.")):
        # `import transformer_engine.pytorch as te` binds the submodule via attribute access on the root.
        return _InertTE("transformer_engine")
    return builtins.__import__(name, globals, locals, fromlist, level)


def imports_te_unconditionally(source: str) -> bool:
    """True when `source` imports transformer_engine at module level outside a try block."""
    for node in ast.parse(source).body:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(n == "transformer_engine" or n.startswith("transformer_engine.") for n in names):
            return True
    return False


class _TEImporterLoader(importlib.abc.Loader):
    """Executes the real module source with the TE stand-in visible to that module alone."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        private_builtins = dict(vars(builtins))
        private_builtins["__import__"] = _te_stand_in_import
        module.__dict__["__builtins__"] = private_builtins
        try:
            self.inner.exec_module(module)
        finally:
            module.__dict__["__builtins__"] = builtins


_LoraLayersLoader = _TEImporterLoader  # the name of the single-module layout


class _TEImporterFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that wraps the loader of the TE_IMPORTERS modules whose source imports TE unconditionally."""

    def __init__(self) -> None:
        self.wrapped: list[str] = []
        """Modules that got the stand-in in this process (feature detection's outcome)."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname not in TE_IMPORTERS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not spec.origin:
            return None
        try:
            source = Path(spec.origin).read_text()
        except OSError:
            return None
        if not imports_te_unconditionally(source):
            return None
        spec.loader = _TEImporterLoader(spec.loader)
        self.wrapped.append(fullname)
        return spec


_LoraLayersFinder = _TEImporterFinder


def install_import_shims() -> None:
    """Install shim 1 (idempotent) while TE is missing. Must run before megatron.bridge is imported."""
    if transformer_engine_available():
        return
    if not any(isinstance(f, _TEImporterFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TEImporterFinder())


def te_stand_in_modules() -> list[str]:
    """The modules shim 1 gave the TE stand-in in this process (empty before megatron.bridge is imported)."""
    return [m for f in sys.meta_path if isinstance(f, _TEImporterFinder) for m in f.wrapped]


install_import_shims()
