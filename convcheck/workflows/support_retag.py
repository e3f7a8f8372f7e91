"""Re-tag a `convcheck support --json` table with the known-bug catalog of this checkout, without running anything.

A table records each row's untagged findings as lines (`"tp2 config: <tensor> [kind] message"`, the first
MAX_FINDINGS of them, messages cut at 200 characters). A bug named after the run (a new UpstreamBug, a release added
to `seen_in`) explains some of them: `retag` parses those lines back into findings, tags them for the table's bridge
release (and its transformers, from convcheck/gate/releases.toml) with `convcheck.models.tag_upstream_bugs`, and
rebuilds the row's status. Verdicts are kept as run; a row whose untagged findings were not all recorded stays FAIL
(what was not recorded cannot be said to be explained). No torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from convcheck.gate.release_table import get_release
from convcheck.models import UPSTREAM_BUG, tag_upstream_bugs
from convcheck.verdict import Finding, OracleVerdict
from convcheck.workflows.support import FAIL, KNOWN_FAIL, Row

LINE = re.compile(r"^(?P<layout>\S+) (?P<oracle>[\w-]+): (?P<tensor>.*?) \[(?P<kind>[\w-]+)\] (?P<message>.*)$")
"""One recorded untagged finding (convcheck.workflows.support.row_from_runs)."""
MORE = re.compile(r" \(\+(\d+) more\)$")


def parse_finding(line: str) -> tuple[str, str, Finding] | None:
    """(layout, oracle, finding) of a recorded finding line; None for a line that names no finding (an oracle that
    failed with none)."""
    m = LINE.match(line)
    if not m:
        return None
    return m["layout"], m["oracle"], Finding(tensor=m["tensor"], kind=m["kind"], message=m["message"])


def untagged_total(row: Row) -> int:
    """How many untagged findings the run had: the reason's `(+N more)` count plus one, else those recorded."""
    m = MORE.search(row.reason)
    return int(m[1]) + 1 if m else len(row.findings)


def retag_row(row: Row, bridge: str, transformers: str) -> Row:
    """`row` with every recorded untagged finding a known bug now explains tagged; its status rebuilt."""
    if row.status != FAIL or not row.findings:
        return row
    parsed = [(line, parse_finding(line)) for line in row.findings]
    groups: dict[tuple[str, str], list[Finding]] = {}
    for _, p in parsed:
        if p:
            groups.setdefault((p[0], p[1]), []).append(p[2])
    verdicts = [OracleVerdict(name=oracle, checked=len(fs), findings=tuple(fs)) for (_, oracle), fs in groups.items()]
    tagged, _ = tag_upstream_bugs(row.arch, bridge, verdicts, versions={"transformers": transformers},
                                  already=row.bugs)  # fmt: skip
    names = {(layout, v.name, f.tensor, f.kind, f.message): f.detail.get(UPSTREAM_BUG)
             for (layout, _), v in zip(groups, tagged, strict=True) for f in v.findings}  # fmt: skip
    bugs = list(row.bugs)
    left = []
    for line, p in parsed:
        bug = names.get((p[0], p[1], p[2].tensor, p[2].kind, p[2].message)) if p else None
        if bug is None:
            left.append(line)
        elif bug not in bugs:
            bugs.append(bug)
    unrecorded = untagged_total(row) - len(row.findings)
    if left:
        reason = left[0] + (f" (+{len(left) - 1 + unrecorded} more)" if len(left) > 1 or unrecorded else "")
        return replace(row, bugs=bugs, findings=left, reason=reason)
    if unrecorded:
        reason = (f"every recorded finding is a known upstream bug ({', '.join(bugs)}); {unrecorded} more untagged "
                  "finding(s) were not recorded by the run")  # fmt: skip
        return replace(row, bugs=bugs, findings=[], reason=reason)
    return replace(row, status=KNOWN_FAIL, bugs=bugs, findings=[], reason="known upstream bug(s): " + ", ".join(bugs))


def retag(rows: Sequence[Row], bridge: str) -> list[Row]:
    """Every row of a table run on megatron-bridge `bridge` (a release of convcheck/gate/releases.toml), re-tagged;
    BadInput for an unknown release."""
    transformers = get_release(bridge).transformers
    return [retag_row(row, bridge, transformers) for row in rows]
