"""The structure of the package holds: no import circle between files or between the package's parts (a top-level
module or sub-package: an import running back up a floor is such a circle), at most 15 modules loose at the top,
no module over 450 lines, and the launcher side (api, cli, the pytest plugin) imports no heavy library. `make lint`
runs this file."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.support.helpers import ROOT

PACKAGE = ROOT / "convcheck"
MAX_TOP_LEVEL, MAX_LINES = 15, 450
HEAVY = ("torch", "megatron", "transformers", "safetensors", "numpy")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """The package modules `path` imports anywhere in it (functions and TYPE_CHECKING blocks included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("convcheck"):
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module or ""
                for a in node.names
            ]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("convcheck")]
        for name in names:
            while name not in MODULES and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in MODULES:
                out.add(name)
    return out


def _part(module: str) -> str:
    """convcheck.X for a module at the top or anywhere in sub-package X."""
    return ".".join(module.split(".")[:2])


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def test_no_import_circle_between_files() -> None:
    edges = {m: _imports(p) - {m} for m, p in MODULES.items()}
    assert _circles(edges) == []


def test_no_import_circle_between_parts() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for target in _imports(path):
            a, b = _part(module), _part(target)
            if a != b and "convcheck" not in (a, b):  # the package's own __init__ re-exports from below
                edges[a].add(b)
    edges.update({p: edges.get(p, set()) for p in {_part(m) for m in MODULES}})
    assert _circles(edges) == []


def test_circles_are_found() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_few_modules_at_the_top_and_none_too_long() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top
    long = {
        str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_launcher_side_imports_no_heavy_library() -> None:
    code = (
        "import sys, convcheck, convcheck.api, convcheck.cli, convcheck.pytest_plugin, convcheck.testing; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert res.stdout.strip() == "[]", res.stdout
