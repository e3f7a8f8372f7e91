"""Hooks for `convcheck bisect` over Megatron-Bridge's history ([docs/gate.md](../docs/gate.md#finding-the-commit)).

`--hook examples/bisect_hooks.py:stub_fla`: Megatron-Bridge commits 2f0f8c80e..6fe6e59bd (the Kimi K3 backbone, #5130,
until #5512 deferred its imports) import `fla.modules` when `megatron.bridge` is imported, so without
flash-linear-attention every one of those 176 commits fails to import and bisect can only skip them. Loading this file
(each rank loads its hooks before it imports the bridge) puts a stand-in `fla.modules` in `sys.modules` whose two
classes raise when built: the bridge imports, a model that really needs fla still fails, and every other `fla` import
(megatron-core's `fla.ops...`, `fla.modules.l2norm`) fails as it does without fla.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types


class _NeedsFla:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise ImportError("flash-linear-attention is not installed (stand-in from examples/bisect_hooks.py)")


def _install() -> None:
    if "fla" in sys.modules or importlib.util.find_spec("fla") is not None:
        return  # the real fla is there
    package = types.ModuleType("fla")
    # a spec, so importlib.util.find_spec("fla") answers; no __version__ and no __file__, so transformers'
    # is_flash_linear_attention_available() still says False
    package.__spec__ = importlib.machinery.ModuleSpec("fla", None, is_package=True)
    package.__path__ = []  # a package without submodules: `import fla.ops.x` fails as without fla
    modules = types.ModuleType("fla.modules")
    modules.FusedRMSNormGated = modules.ShortConvolution = _NeedsFla
    package.modules = modules
    sys.modules.update({"fla": package, "fla.modules": modules})


_install()  # at load time, before the rank imports megatron.bridge


def stub_fla() -> None:
    """Nothing left to do: the stand-in was installed when the rank loaded this file."""
