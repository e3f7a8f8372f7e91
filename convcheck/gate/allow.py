"""The allow file: reviewed, expected differences (each with a reason) that `gate check` does not fail on.

JSON `{"allow": [ENTRY, ...]}` or TOML `[[allow]]` tables; an ENTRY has `kind` (a kind of convcheck.gate.check.KINDS),
`reason` (why it is expected), and optional `case` and `subject` shell-style patterns (default `*`).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from convcheck.errors import BadInput
from convcheck.gate.check import KINDS, Difference

_KEYS = {"kind", "reason", "case", "subject"}


@dataclass(frozen=True, kw_only=True, slots=True)
class AllowEntry:
    """One reviewed expected difference: which kind, on which case(s) and subject(s), and why."""

    kind: str
    reason: str
    case: str = "*"
    subject: str = "*"
    index: int = 0
    """Position in the file (1-based), for messages."""

    def matches(self, diff: Difference) -> bool:
        return diff.kind == self.kind and fnmatchcase(diff.case, self.case) and fnmatchcase(diff.subject, self.subject)

    def applies_to(self, case: str) -> bool:
        """True when this entry's case pattern names `case` (an entry for cases not run is not 'unused')."""
        return fnmatchcase(case, self.case)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "case": self.case, "subject": self.subject, "reason": self.reason}

    @property
    def label(self) -> str:
        return f"allow entry {self.index} ({self.kind} {self.case} {self.subject})"


def load_allow(path: str | Path) -> list[AllowEntry]:
    """The entries of an allow file (.toml is TOML, anything else JSON); BadInput names the first problem."""
    file = Path(path)
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read allow file {path}: {exc}") from None
    try:
        data = tomllib.loads(text) if file.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(
            f"allow file {path} is not valid {'TOML' if file.suffix == '.toml' else 'JSON'}: {exc}"
        ) from None
    entries = data.get("allow") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise BadInput(f"allow file {path} needs a list named 'allow' of entries with kind and reason")
    return [_entry(path, i, raw) for i, raw in enumerate(entries, 1)]


def _entry(path: str | Path, index: int, raw: Any) -> AllowEntry:
    where = f"allow file {path}, entry {index}"
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: an entry is a table/object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise BadInput(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(_KEYS))}")
    for key in _KEYS & set(raw):
        if not isinstance(raw[key], str):
            raise BadInput(f"{where}: {key} must be a string")
    if raw.get("kind") not in KINDS:
        raise BadInput(f"{where}: kind {raw.get('kind')!r} is not one of {', '.join(KINDS)}")
    if not str(raw.get("reason", "")).strip():
        raise BadInput(f"{where}: every entry needs a reason (why the difference is expected)")
    return AllowEntry(
        kind=raw["kind"],
        reason=raw["reason"].strip(),
        case=raw.get("case", "*"),
        subject=raw.get("subject", "*"),
        index=index,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Triage:
    """Differences split by the allow file, and the entries that matched nothing in the cases that ran."""

    failing: tuple[Difference, ...]
    allowed: tuple[tuple[Difference, AllowEntry], ...]
    unused: tuple[AllowEntry, ...]


def triage(differences: list[Difference], entries: list[AllowEntry], cases_run: list[str]) -> Triage:
    """Allowed differences (first matching entry) and failing ones; entries for cases that ran but matched nothing."""
    failing, allowed, used = [], [], set()
    for diff in differences:
        entry = next((e for e in entries if e.matches(diff)), None)
        if entry is None:
            failing.append(diff)
        else:
            allowed.append((diff, entry))
            used.add(entry.index)
    unused = tuple(e for e in entries if e.index not in used and any(e.applies_to(c) for c in cases_run))
    return Triage(failing=tuple(failing), allowed=tuple(allowed), unused=unused)
