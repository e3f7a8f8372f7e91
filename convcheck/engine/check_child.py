"""`python -m convcheck.engine.check_child KIND SPEC [SPEC ...]`: import each `MODULE:NAME` / `FILE.py:NAME` spec and
check it is what KIND needs (hook, rank function: callable; sender: callable; receiver: a class with load_weights
and a way to read its state back), in a process of its own: the specs' modules may import torch, which the launcher
side never does. Answers one JSON line: {spec: the one-line problem} for each spec that fails (empty: all good)."""

from __future__ import annotations

import json
import sys

from convcheck.errors import BadInput, one_line
from convcheck.hooks import load_hook
from convcheck.sync.adapters import load_receiver, load_sender


def problem(kind: str, spec: str) -> str | None:
    """The one-line problem of `spec` as a KIND, or None."""
    try:
        if kind == "sender":
            load_sender(spec)
        elif kind == "receiver":
            load_receiver(spec)
        elif not callable(load_hook(spec, what=kind)):
            return f"{kind} {spec} is not callable"
    except BadInput as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a module that fails to import is bad input, named in one line
        return f"{kind} {spec!r} cannot be imported: {one_line(exc)}"
    return None


def main(argv: list[str] | None = None) -> int:
    kind, *specs = sys.argv[1:] if argv is None else argv
    found = {spec: text for spec in specs if (text := problem(kind, spec)) is not None}
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
