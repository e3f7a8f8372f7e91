"""The structure of the package holds: no import circle between files or between the package's parts (a top-level
module or sub-package: an import running back up a floor is such a circle), at most 15 modules loose at the top,
no module over 450 lines, and the import contract between the launcher side and the rank side: nothing the launcher
side can import imports a heavy library. `make lint` runs this file."""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
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
        "import sys, convcheck, convcheck.api, convcheck.cli, convcheck.pytest_plugin, convcheck.workflows.selftest; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert res.stdout.strip() == "[]", res.stdout


# ---- the border between the launcher side and the rank side ------------------------------------------------------
LAUNCHER_ROOTS = (
    "convcheck",
    "convcheck.__main__",
    "convcheck.api",
    "convcheck.cli",
    "convcheck.cli.*",
    "convcheck.pytest_plugin",
    "convcheck.workflows",
    "convcheck.workflows.*",
    "convcheck.gate",
    "convcheck.gate.*",
    "convcheck.engine.launch",
    "convcheck.engine.job",
    "convcheck.engine.outcome",
    "convcheck.engine.resume",
    "convcheck.engine.nodes",
    "convcheck.engine.place",
    "convcheck.engine.reference",
    "convcheck.engine.rollcall",
    "convcheck.engine.store",
    "convcheck.engine.warm_client",
    "convcheck.fork.client",
)
"""The launcher side: what a user's process runs (the CLI, the library API, the pytest plugin) and the workflows,
gate and launch code under it (fnmatch patterns of module names)."""


def _when_run(source: str, module: str, modules: Iterable[str]) -> tuple[set[str], list[str]]:
    """(the package modules `module` can import when it runs, its heavy-library import statements): imports anywhere
    in it (functions included) but TYPE_CHECKING blocks, and the packages above it (Python imports those first)."""
    known = set(modules)
    tree = ast.parse(source)
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    found, heavy = set(), []
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif node.level == 0:
            names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        if any(n.split(".")[0] in HEAVY for n in names):
            heavy.append(f"line {node.lineno}: {ast.unparse(node)}")
        for name in (n for n in names if n.startswith("convcheck")):
            while name not in known and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in known:
                found.add(name)
    found |= {p for i in range(1, module.count(".") + 1) if (p := module.rsplit(".", i)[0]) in known}
    return found - {module}, heavy


def crossings(sources: dict[str, str], roots: Iterable[str]) -> dict[str, str]:
    """Every module the launcher side (`roots`) can reach that imports a heavy
    library: module -> the import and the chain that reaches it. `sources`: module name -> its source text; `roots`:
    fnmatch patterns of the launcher side's own modules."""
    scanned = {m: _when_run(text, m, sources) for m, text in sources.items()}
    start = [m for m in sources if any(fnmatch.fnmatchcase(m, r) for r in roots)]
    via: dict[str, str] = {m: "" for m in start}
    todo = list(start)
    while todo:
        module = todo.pop()
        for target in sorted(scanned[module][0] - via.keys()):
            via[target] = module
            todo.append(target)
    out = {}
    for module in via:
        if scanned[module][1]:
            chain = [module]
            while via[chain[-1]]:
                chain.append(via[chain[-1]])
            out[module] = f"{scanned[module][1][0]} (reached: {' <- '.join(chain)})"
    return out


def test_the_launcher_side_reaches_no_module_that_imports_a_heavy_library() -> None:
    """The import contract: nothing the launcher side can import, at module top or inside a function, imports
    torch, megatron, transformers, safetensors or numpy. It meets the rank side only through the Job (JSON), the
    catalog of pure data both sides read (oracle descriptions, fixture specs, model families, known bugs, mutants)
    and names the ranks import (`OracleInfo.module`, hooks, rank functions, `Architecture.mapping_rules`)."""
    sources = {m: p.read_text() for m, p in MODULES.items()}
    assert crossings(sources, LAUNCHER_ROOTS) == {}


def test_the_contract_names_a_crossing_and_its_chain() -> None:
    sources = {
        "convcheck": "",
        "convcheck.cli": "",
        "convcheck.cli.main": "def f():\n    from convcheck.oracles.logits import run\n",
        "convcheck.oracles": "",
        "convcheck.oracles.logits": "import torch\n",
        "convcheck.oracles.base": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
    }
    assert crossings(sources, ("convcheck.cli", "convcheck.cli.*")) == {
        "convcheck.oracles.logits": "line 1: import torch (reached: convcheck.oracles.logits <- convcheck.cli.main)"
    }


def _function_level_heavy_imports(source: str) -> list[str]:
    """`line: statement` of each heavy-library import inside a function (TYPE_CHECKING blocks are module level)."""
    out = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(n.split(".")[0] in HEAVY for n in names):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(out))


def test_the_rank_side_imports_its_libraries_at_module_top() -> None:
    """Outside the launcher side (which never imports them), torch, megatron, transformers, safetensors and numpy
    are imported at module top like any torch code: the real dependencies are visible where a module starts."""
    sources = {m: p.read_text() for m, p in MODULES.items()}
    inside = {m: found for m, text in sources.items() if (found := _function_level_heavy_imports(text))}
    assert inside == {}
    assert _function_level_heavy_imports("def f():\n    import torch\n") == ["2: import torch"]


def _bridge_before_boot(source: str) -> str | None:
    """The first module-top import of megatron.bridge not preceded by `import convcheck.boot` (None: none)."""
    booted = False
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import) and any(a.name == "convcheck.boot" for a in node.names):
            booted = True
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        names += [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        if not booted and any(n.startswith("megatron.bridge") for n in names):
            return f"{node.lineno}: {ast.unparse(node)}"
    return None


def test_every_module_importing_the_bridge_installs_the_te_import_stand_in_first() -> None:
    """megatron.bridge imports Transformer Engine unconditionally (peft/lora_layers.py:20): convcheck.boot installs
    the stand-in (shim 1) and must be imported before the bridge, whichever convcheck module a process imports first."""
    sources = {m: p.read_text() for m, p in MODULES.items()}
    assert {m: line for m, text in sources.items() if (line := _bridge_before_boot(text))} == {}
    assert (
        _bridge_before_boot("from megatron.bridge import AutoBridge\n") == "1: from megatron.bridge import AutoBridge"
    )
