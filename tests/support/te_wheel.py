"""Read Transformer Engine's own Python source out of its wheel, never importing it (TE needs CUDA): which parameters
a TE module's `__init__` registers, written as TE's source writes their shapes and dtypes."""

from __future__ import annotations

import ast
import os
import zipfile
from pathlib import Path

WHEEL_GLOB = "transformer_engine_cu13-{version}-*.whl"
WHEEL_ENV = "CONVCHECK_TE_WHEEL"
"""A path to the wheel; else `$CONVCHECK_CACHE_DIR/te-wheel/` (`make te-wheel` downloads it there)."""


def find_wheel(version: str) -> Path | None:
    """The transformer-engine-cu13 wheel of `version`, where $CONVCHECK_TE_WHEEL or the cache folder has it."""
    given = os.environ.get(WHEEL_ENV)
    if given:
        return Path(given) if Path(given).is_file() else None
    folder = Path(os.environ.get("CONVCHECK_CACHE_DIR", ".cache")) / "te-wheel"
    found = sorted(folder.glob(WHEEL_GLOB.format(version=version))) if folder.is_dir() else []
    return found[0] if found else None


def wheel_source(wheel: Path, path: str) -> str:
    """The text of one file inside the wheel."""
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(path).decode()


def _norm(text: str) -> str:
    return text.replace("self.", "")


def _class_init(source: str, cls: str) -> ast.FunctionDef:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return item
    raise LookupError(f"no {cls}.__init__ in the source")


class _Resolver:
    """Follows local names of one function back to what was assigned to them (the last assignment before a line)."""

    def __init__(self, function: ast.FunctionDef) -> None:
        self.assigns: list[tuple[int, str, ast.expr]] = []
        self.lists: dict[str, list[str]] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    self.assigns.append((node.lineno, target.id, node.value))
                elif isinstance(target, ast.Attribute) and isinstance(node.value, ast.List) and node.value.elts:
                    items = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
                    self.lists.setdefault(_norm(ast.unparse(target)), [str(i) for i in items])

    def value(self, name: str, before: int) -> tuple[int, ast.expr]:
        """(line, value) of the last assignment to `name` before line `before`."""
        earlier = [(line, value) for line, target, value in self.assigns if target == name and line < before]
        if not earlier:
            raise LookupError(f"no assignment to {name} before line {before}")
        return max(earlier, key=lambda item: item[0])

    def tensor(self, node: ast.expr, line: int) -> ast.Call:
        """The torch.empty / torch.zeros call a Parameter(...) argument comes from."""
        while True:
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Parameter"):
                node = node.args[0]
            elif isinstance(node, ast.Name):
                line, node = self.value(node.id, line)
            elif isinstance(node, ast.Subscript):  # a slice of a buffer (Linear's split parameters)
                node = node.value
            elif isinstance(node, ast.Call):
                return node
            else:
                raise LookupError(f"cannot follow {ast.unparse(node)}")

    def name(self, node: ast.expr) -> str:
        if isinstance(node, ast.Constant):
            return str(node.value)
        if isinstance(node, ast.JoinedStr):
            return "".join(
                str(v.value) if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}" for v in node.values
            )
        if isinstance(node, ast.Subscript):  # self.weight_names[i]: the default (unsplit) list
            return self.lists[_norm(ast.unparse(node.value))][0]
        raise LookupError(f"cannot name {ast.unparse(node)}")

    def dtype(self, call: ast.Call, line: int) -> str | None:
        node = next((k.value for k in call.keywords if k.arg == "dtype"), None)
        while node is not None:
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "canonicalize_dtype":
                node = node.args[0]
            elif isinstance(node, ast.Name) and any(t == node.id and ln < line for ln, t, _ in self.assigns):
                line, resolved = self.value(node.id, line)
                if any(isinstance(n, ast.Name) and n.id == node.id for n in ast.walk(resolved)):
                    return node.id  # the argument itself, defaulted or canonicalized (`dtype = f(dtype)`)
                node = resolved
            else:
                return _norm(ast.unparse(node))
        return None


def registered_parameters(source: str, cls: str) -> list[tuple[str, tuple[str, ...], str | None]]:
    """(name, shape expressions, dtype argument) of every `self.register_parameter(...)` in `cls.__init__`, in source
    order; `self.` dropped, `canonicalize_dtype` unwrapped, None for torch's default dtype."""
    init = _class_init(source, cls)
    resolver = _Resolver(init)
    calls = [
        n for n in ast.walk(init) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("register_parameter")
    ]
    out = []
    for call in sorted(calls, key=lambda c: c.lineno):
        tensor = resolver.tensor(call.args[1], call.lineno)
        shape = tuple(_norm(ast.unparse(a)) for a in tensor.args)
        out.append((resolver.name(call.args[0]), shape, resolver.dtype(tensor, tensor.lineno)))
    return out


def te_bases(source: str) -> dict[str, str]:
    """Class name -> its first base as written (`te.pytorch.Linear`) in megatron-core's TE extension."""
    return {
        node.name: ast.unparse(node.bases[0])
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.bases
    }
