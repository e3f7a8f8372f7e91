"""Oracles: each answers one question about a conversion with a typed verdict.

This package's top is the launcher side's view of them, pure data: each oracle's description (OracleInfo, declared in
convcheck.oracles.catalog*) with the options it owns, and the lookups the CLI, `api.prepare` and the Job read. An
oracle itself is a rank-side module (`OracleInfo.module`) with a collective `run(ctx: RankContext) -> OracleVerdict |
None`: every rank calls it, rank 0 returns the verdict; the ranks import it by name (`load_oracle`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from convcheck.errors import BadInput
from convcheck.oracles.base import OracleInfo, OracleOption
from convcheck.oracles.catalog import (
    CONFIG,
    COVERAGE,
    DIFFERENTIAL,
    ELEMENTS,
    LAYOUT_INVARIANCE,
    LOGITS,
    MAPPING,
    ROUNDTRIP,
)
from convcheck.oracles.catalog_store import DISTCKPT, QUANT, QUANT_IMPORT, RESHARD, SAVE
from convcheck.oracles.catalog_sync import BROADCAST, DELTA, ENGINE, IDEMPOTENCE, RECEIVER

_INFOS: tuple[OracleInfo, ...] = (
    COVERAGE,
    ROUNDTRIP,
    CONFIG,
    LOGITS,
    DIFFERENTIAL,
    ELEMENTS,
    LAYOUT_INVARIANCE,
    MAPPING,
    RECEIVER,
    IDEMPOTENCE,
    DELTA,
    BROADCAST,
    DISTCKPT,
    RESHARD,
    SAVE,
    QUANT,
    QUANT_IMPORT,
    ENGINE,
)
"""In the order a run executes them; the opt-in ones (default False) run only when named."""

ORACLES: dict[str, OracleInfo] = {info.name: info for info in _INFOS}
DEFAULT_ORACLES: tuple[str, ...] = tuple(name for name, info in ORACLES.items() if info.default)
"""What a plain `verify` runs."""


OPTIONS: dict[str, tuple[str, OracleOption]] = {
    option.key: (info.name, option) for info in ORACLES.values() for option in info.options
}
"""Option key -> (the oracle that owns it, its declaration): every oracle-owned `verify` option."""
assert len(OPTIONS) == sum(len(i.options) for i in ORACLES.values()), "two oracles declare one option key"


def collect_options(names: Sequence[str], given: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The oracle options of a run ({oracle: {key: value}}, only those given), each validated by its declaration;
    BadInput for an unknown key, or an option whose oracle is not among `names`."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in (given or {}).items():
        if key not in OPTIONS:
            raise BadInput(f"unknown oracle option {key!r}; known: {', '.join(OPTIONS)}")
        oracle, option = OPTIONS[key]
        if not option.given(value):
            continue
        if oracle not in names:
            raise BadInput(f"{option.flag} is an option of the {oracle} oracle; add --oracle {oracle}")
        out.setdefault(oracle, {})[key] = option.normalized(value)
    for name in names:
        if ORACLES[name].ready is not None:
            ORACLES[name].ready(out.get(name, {}))
    return out


def stored_options(data: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """A Job's oracle options read back from JSON (repeatable values as tuples again)."""
    return {
        oracle: {k: tuple(v) if OPTIONS[k][1].multiple else v for k, v in values.items()}
        for oracle, values in data.items()
    }


def option_args(options: Mapping[str, Mapping[str, Any]], oracles: Sequence[str]) -> list[str]:
    """The `verify` words that set again the options of `oracles` (in declaration order)."""
    return [
        word
        for name in oracles
        for option in ORACLES[name].options
        if option.key in options.get(name, {})
        for word in option.replay(options[name][option.key])
    ]


def start_early(names: Sequence[str], options: Mapping[str, Mapping[str, Any]], spec: Any) -> dict[str, Any]:
    """Rank 0: each selected oracle's early work (OracleInfo.early), started before the model is built."""
    out: dict[str, Any] = {}
    try:
        for name in names:
            if ORACLES[name].early:
                module, function = ORACLES[name].early.split(":")
                out[name] = getattr(importlib.import_module(module), function)(options.get(name, {}), spec)
    except BaseException:
        close_early(out)
        raise
    return out


def close_early(handles: Mapping[str, Any]) -> None:
    """End what `start_early` started (each handle's close)."""
    for handle in handles.values():
        handle.close()


def riders(names: Sequence[str], *, live: bool = False) -> frozenset[str]:
    """The oracles of a run (in run order) that do their work inside an earlier oracle's: each declares what it rides
    on (OracleInfo.rides_on; in a live check OracleInfo.live_rides_on where it has one), and an oracle before it that
    provides that (drains_export, reads_source) runs. Each one's rank-side `ride(ctx)` sets up its consumer on the
    run's export pass (convcheck.rank.export_pass)."""
    provides = {"export": lambda i: i.drains_export, "source": lambda i: i.reads_source}
    out = set()
    for position, name in enumerate(names):
        info = ORACLES[name]
        ride = (info.live_rides_on if live else "") or info.rides_on
        if ride and any(provides[ride](ORACLES[earlier]) for earlier in names[:position]):
            out.add(name)
    return frozenset(out)


def ride(ctx: Any, names: Sequence[str], *, live: bool = False) -> None:
    """Rank side, collective: set up, in run order, the consumer of each oracle of `names` that rides on an earlier
    one's work (`riders`) on the run's export pass: its rank-side module's `ride(ctx)` (the live variant's in a live
    check; convcheck.rank.export_pass)."""
    riding = riders(names, live=live)
    for name in names:
        if name in riding:
            importlib.import_module(live_module(name) if live else ORACLES[name].module).ride(ctx)


def parse_oracle_names(spec: str | None) -> tuple[str, ...]:
    """Split `a,b` into known oracle names (the default set when empty); BadInput names an unknown one."""
    if not spec:
        return DEFAULT_ORACLES
    names = tuple(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    unknown = [n for n in names if n not in ORACLES]
    if unknown or not names:
        wrong = ", ".join(unknown) if unknown else repr(spec)
        raise BadInput(f"unknown oracle {wrong}; known: {', '.join(ORACLES)}")
    return names


def oracles_markdown() -> str:
    """The table README.md embeds between its `oracles:begin` / `oracles:end` markers (each oracle's description)."""
    lines = ["| oracle | proves | does not prove |", "| --- | --- | --- |"]
    lines += [f"| `{i.name}` | {i.proves} | {i.does_not_prove} |" for i in ORACLES.values()]
    return "\n".join(lines) + "\n"


def load_oracle(name: str) -> Callable[[Any], Any]:
    """The `run` function of oracle `name` (imports its rank-side module)."""
    return importlib.import_module(ORACLES[name].module).run


LIVE_ORACLES: tuple[str, ...] = tuple(name for name, info in ORACLES.items() if info.live)
"""The oracles that can run inside a user's job with no HF source of the weights' values (convcheck.live)."""
LIVE_DEFAULT: tuple[str, ...] = ("coverage", "differential", "mapping")
_LIVE_MODULES: dict[str, str] = {
    "mapping": "convcheck.oracles.mapping_live",
    "receiver": "convcheck.oracles.receiver_live",
}
"""The oracles whose live variant is another module's `run`."""


def parse_live_names(names: Sequence[str] | str | None) -> tuple[str, ...]:
    """Known oracles that can run live, in run order (LIVE_DEFAULT when empty); BadInput names an unknown one or one
    that needs an HF source of the weights' values."""
    spec = names if isinstance(names, str) or names is None else ",".join(names)
    asked = parse_oracle_names(spec) if spec else LIVE_DEFAULT
    sourced = [n for n in asked if not ORACLES[n].live]
    if sourced:
        raise BadInput(
            f"oracle {', '.join(sourced)} needs an HF source of the weights' values, which a live check does not "
            f"have; live: {', '.join(LIVE_ORACLES)}"
        )
    return tuple(n for n in ORACLES if n in asked)


def live_module(name: str) -> str:
    """The rank-side module oracle `name` uses inside a user's job (its own unless it has a live variant)."""
    return _LIVE_MODULES.get(name, ORACLES[name].module)


def load_live_oracle(name: str) -> Callable[[Any], Any]:
    """The `run` function oracle `name` uses inside a user's job (its own unless it has a live variant)."""
    return importlib.import_module(live_module(name)).run


def live_markdown() -> str:
    """The table docs/live.md embeds between its `live:begin` / `live:end` markers (each oracle's INFO.live)."""
    lines = ["| oracle | proves live (no HF source) |", "| --- | --- |"]
    lines += [f"| `{i.name}` | {i.live or 'needs an HF source: refused'} |" for i in ORACLES.values()]
    return "\n".join(lines) + "\n"


__all__ = [
    "OPTIONS",
    "OracleOption",
    "close_early",
    "collect_options",
    "start_early",
    "option_args",
    "stored_options",
    "LIVE_DEFAULT",
    "LIVE_ORACLES",
    "live_markdown",
    "load_live_oracle",
    "live_module",
    "parse_live_names",
    "ride",
    "riders",
    "DEFAULT_ORACLES",
    "ORACLES",
    "OracleInfo",
    "load_oracle",
    "oracles_markdown",
    "parse_oracle_names",
]
