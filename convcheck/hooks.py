"""`MODULE:FUNC` / `FILE.py:FUNC` specs for callables convcheck runs in every rank: parsed once, loaded late."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from convcheck.errors import BadInput, SetupError
from convcheck.fork.client import WarmTimeout, child_output


@dataclass(frozen=True, kw_only=True, slots=True)
class HookSpec:
    """A parsed `target:function`, where target is a module path or a `.py` file."""

    target: str
    function: str

    @property
    def is_file(self) -> bool:
        return self.target.endswith(".py")

    def __str__(self) -> str:
        return f"{self.target}:{self.function}"


def parse_hook(spec: str, *, what: str = "hook") -> HookSpec:
    """Check the form (and that a named file exists) without importing anything; BadInput on a bad spec."""
    target, _, function = spec.rpartition(":")
    if not target or not function.isidentifier():
        raise BadInput(f"{what} {spec!r} is not of the form MODULE:FUNCTION or FILE.py:FUNCTION")
    parsed = HookSpec(target=target, function=function)
    if parsed.is_file and not Path(target).is_file():
        raise BadInput(f"{what} file not found: {target}")
    return parsed


def load_hook(spec: str, *, what: str = "hook") -> Callable[..., Any]:
    """Import the module or file of `spec` and return its function; BadInput names what does not resolve."""
    parsed = parse_hook(spec, what=what)
    if parsed.is_file:
        path = Path(parsed.target)
        module_spec = importlib.util.spec_from_file_location(f"convcheck_hook_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise BadInput(f"{what} file cannot be imported: {parsed.target}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(parsed.target)
        except ImportError as exc:
            raise BadInput(f"{what} {spec!r}: cannot import {parsed.target} ({exc})") from None
    if not hasattr(module, parsed.function):
        raise BadInput(f"{what} {spec!r}: {parsed.target} has no attribute {parsed.function!r}")
    return getattr(module, parsed.function)


def problems_elsewhere(kind: str, specs: list[str]) -> dict[str, str]:
    """Each spec that does not load as a KIND ("hook", "rank function", "sender", "receiver") -> its one-line
    problem, found by importing the specs in a child process (convcheck.engine.check_child): the launcher side
    never imports what they import. SetupError when the child gives no answer."""
    own = [spec for spec in specs if spec.startswith("convcheck.")]
    found = {spec: text for spec in own if (text := _own_problem(spec, kind)) is not None}
    others = [spec for spec in specs if spec not in own]
    if not others:
        return found
    code, stdout, stderr = _check_child([kind, *others])
    lines = stdout.strip().splitlines()
    try:
        return {**found, **json.loads(lines[-1])}
    except (IndexError, ValueError, TypeError):
        tail = (stderr.strip().splitlines() or ["no answer"])[-1]
        raise SetupError(f"checking the {kind} specs failed (exit {code}): {tail}") from None


CHECK_CHILD = "convcheck.engine.check_child"
CHECK_TIMEOUT_S = 600.0


def _check_child(args: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m convcheck.engine.check_child ARGS`: forked by the warm server when
    one takes it (what the specs import is mostly imported there already), else a fresh interpreter."""
    try:
        warm = child_output(CHECK_CHILD, args, CHECK_TIMEOUT_S)
    except WarmTimeout:
        raise SetupError(f"importing the specs took over {CHECK_TIMEOUT_S:g} s; stopped") from None
    if warm is not None:
        return warm
    proc = subprocess.run([sys.executable, "-m", CHECK_CHILD, *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def _own_problem(spec: str, kind: str) -> str | None:
    """A spec in convcheck's own package (a planted bug, a built-in sender or receiver), checked by reading its
    module's source: the module exists and binds the name at its top (importing it would import the whole stack;
    the ranks import it and check the rest)."""
    parsed = parse_hook(spec, what=kind)
    try:
        found = importlib.util.find_spec(parsed.target)
    except ImportError:
        found = None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return f"{kind} {spec!r}: cannot import {parsed.target} (no such module)"
    bound: set[str] = set()
    for node in ast.parse(Path(found.origin).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if parsed.function not in bound:
        return f"{kind} {spec!r}: {parsed.target} has no attribute {parsed.function!r}"
    return None
