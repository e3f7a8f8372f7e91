"""How an oracle is described (convcheck.oracles.catalog*): its name, what it proves and does not prove, where its `run`
lives and the options it owns. Pure data: the launcher side reads it without importing any oracle."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from convcheck.errors import BadInput


@dataclass(frozen=True, kw_only=True, slots=True)
class OracleInfo:
    """One oracle's self-description, shown by `convcheck oracles` and README."""

    name: str
    module: str
    """The rank-side module whose `run(ctx)` is the oracle (imported only on the ranks)."""
    proves: str
    does_not_prove: str
    default: bool = True
    """Runs in a plain `verify` (False: only when named with --oracle)."""
    drains_export: bool = False
    """Its run streams the whole export (an oracle that rides on an export drain can do its work inside it)."""
    reads_source: bool = False
    """Its drain reads every source tensor on rank 0 (an oracle that rides on source reads can check them there)."""
    rides_on: str = ""
    """What of an earlier oracle's work it does its own inside, when such an oracle runs before it: "export"
    (any `drains_export` oracle's drain) or "source" (a `reads_source` oracle's reads); "" for nothing. Its rank-side
    module's `ride(ctx)` sets up its consumer on the run's export pass (convcheck.rank.export_pass) when it rides."""
    live_rides_on: str = ""
    """What it rides on inside a user's job where that differs from `rides_on` (no source there: "export")."""
    live: str = ""
    """What it proves when run inside the user's job on trained weights, with no HF source of their values
    (convcheck.live); "" when it needs such a source (asking for it live is bad input)."""
    options: tuple[OracleOption, ...] = ()
    """The `verify` options it owns (OracleOption): declared here and nowhere else."""
    early: str = ""
    """`module:function` of work rank 0 starts before the model is built, to overlap with it (e.g. the engine
    process loading the checkpoint): called as function(its options, the RankSpec); what it returns (closed with
    `.close()` when the job ends) reaches `run` as `ctx.early[name]`."""
    ready: Callable[[Mapping[str, Any]], Any] | None = None
    """Launcher-side check, before any rank starts, that the oracle can run with the options given (its key ->
    value; BadInput naming what is missing otherwise), e.g. that the engine's environment exists."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OracleOption:
    """One `verify` option an oracle owns, declared once beside its INFO: the command line, `api.prepare`'s
    validation, the Job, the replay line and the rank all read it from here (nothing relays it by hand)."""

    flag: str
    """The command-line spelling, e.g. `--save-dtype`; its key (`save_dtype`) names it in `api.verify(options=...)`,
    in the Job and in `RankContext.options`."""
    help: str
    choices: tuple[str, ...] = ()
    """A closed set of spellings (empty: any value of `kind`)."""
    kind: type = str
    """What the command line parses a value as: str, int or float."""
    multiple: bool = False
    """Repeatable: the value is a tuple."""
    default: Any = None
    """What the oracle reads when the option is not given (never stored in the Job)."""
    metavar: str | None = None
    check: Callable[[Any], Any] | None = None
    """Launcher-side validation (pure Python, no torch): the value to store, or BadInput naming the problem."""

    @property
    def key(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def given(self, value: Any) -> bool:
        """Whether `value` (as the command line or a caller hands it over) sets this option."""
        return value is not None and value != () and value != []

    def normalized(self, value: Any) -> Any:
        """`value` as the Job stores it: a tuple when repeatable, each item of `kind`, in `choices`, `check`ed;
        BadInput naming the flag otherwise."""
        items = tuple(value) if self.multiple and isinstance(value, (list, tuple)) else (value,)
        out = []
        for item in items:
            if self.kind in (int, float) and (isinstance(item, bool) or not isinstance(item, (int, float))):
                raise BadInput(f"{self.flag} must be a number, got {item!r}")
            if self.kind is str and not isinstance(item, str):
                raise BadInput(f"{self.flag} must be a string, got {item!r}")
            if self.choices and item not in self.choices:
                raise BadInput(f"{self.flag} must be one of {', '.join(self.choices)}, got {item!r}")
            out.append(self.kind(item))
        value = tuple(out) if self.multiple else out[0]
        return self.check(value) if self.check is not None else value

    def replay(self, value: Any) -> list[str]:
        """The command-line words that set `value` again."""
        items = value if self.multiple else (value,)
        return [word for item in items for word in (self.flag, f"{item:g}" if isinstance(item, float) else str(item))]


def option_values(info: OracleInfo, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every option `info` declares: the value of `given` (a run's options for this oracle), else its default."""
    return {o.key: given.get(o.key, o.default) for o in info.options}
