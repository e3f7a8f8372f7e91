"""Click parameter types: layouts, oracle lists and hook specs are validated here, at the edge."""

from __future__ import annotations

from typing import Any

import click

from convcheck.errors import ConvcheckError
from convcheck.hooks import parse_hook
from convcheck.layout import ParallelLayout
from convcheck.oracles import parse_oracle_names


class OracleList(click.ParamType):
    """`a,b` -> a tuple of known oracle names (empty: every oracle)."""

    name = "ORACLES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        if not str(value).replace(",", "").strip():
            self.fail(f"needs at least one oracle name, got {value!r}", param, ctx)
        try:
            return parse_oracle_names(value)
        except ConvcheckError as exc:
            self.fail(str(exc), param, ctx)


class HookSpecType(click.ParamType):
    """`MODULE:FUNC` or `FILE.py:FUNC`, checked for form (and the file's existence) without importing it."""

    name = "MODULE:FUNC"

    def __init__(self, what: str = "hook", builtins: tuple[str, ...] = ()) -> None:
        self.what = what
        self.builtins = builtins  # names accepted as they are (built-in adapters such as `bucketed`)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if value in self.builtins:
            return str(value)
        try:
            return str(parse_hook(str(value), what=self.what))
        except ConvcheckError as exc:
            self.fail(str(exc), param, ctx)


class LayoutType(click.ParamType):
    """A layout spelled `tp2ep2`, `pp2`, `TP2xEP2` -> ParallelLayout."""

    name = "LAYOUT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, ParallelLayout):
            return value
        try:
            return ParallelLayout.parse(str(value))
        except ConvcheckError as exc:
            self.fail(str(exc), param, ctx)


class ReportPath(click.ParamType):
    """A report file to write: its folder must exist and be writable, and it must not be a folder itself."""

    name = "FILE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        import tempfile
        from pathlib import Path

        target = Path(str(value))
        folder = target.resolve().parent
        if target.is_dir():
            self.fail(f"{value} is a folder, not a file", param, ctx)
        if not folder.exists():
            self.fail(f"output folder does not exist: {target.parent}", param, ctx)
        if not folder.is_dir():
            self.fail(f"not a folder: {target.parent}", param, ctx)
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".convcheck-probe-"):
                pass
        except OSError as exc:
            self.fail(f"cannot write into {target.parent}: {exc.strerror}", param, ctx)
        return str(value)
