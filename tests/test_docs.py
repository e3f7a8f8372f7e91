"""README.md and the code say the same thing: the oracle table is the oracles' own descriptions
(convcheck.oracles.catalog*). The README stays a short user guide, and every relative link in the Markdown docs
points at a file or folder that exists."""

from __future__ import annotations

import re
from pathlib import Path

from convcheck.oracles import oracles_markdown
from tests.support.helpers import ROOT

README_MAX_LINES = 400
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^()\s]+)\)")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "results" / "README.md"]


def relative_links(path: Path) -> list[str]:
    """The targets of `[text](target)` links outside code, without any `#anchor`; web and same-page links left out."""
    text = CODE_SPAN.sub("``", FENCE.sub("", path.read_text()))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t.split("#", 1)[0] for t in targets if not t.startswith(("http://", "https://", "#"))]


def test_readme_oracle_table_is_generated_from_the_modules() -> None:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- oracles:begin[^\n]*-->\n(.*?)<!-- oracles:end -->", text, re.DOTALL)
    assert match, "README.md lost its oracles:begin / oracles:end markers"
    assert match.group(1) == oracles_markdown(), "run `convcheck oracles --markdown` and paste it into README.md"


def test_readme_opens_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    assert "make demo" in head and "make test" in head


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_every_relative_link_resolves() -> None:
    files = markdown_files()
    assert all(f.is_file() for f in files), [str(f) for f in files if not f.is_file()]
    broken = [
        f"{f.relative_to(ROOT)}: {target}"
        for f in files
        for target in relative_links(f)
        if not (f.parent / target).exists()
    ]
    assert broken == [], broken


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target).resolve() for target in relative_links(ROOT / "README.md")}
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    assert [p.name for p in pages if p.resolve() not in linked] == []


ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|"
    "fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth"
)
RELATIVE = "this|that|last|next|previous|prior|earlier|later|past|same|one|two|three|four|five|several"
WORK_PERIOD = re.compile(rf"({ORDINALS}|{RELATIVE}|\d+(st|nd|rd|th))\s+(sessions?|work\s+periods?)", re.IGNORECASE)
ISO_DATE = re.compile(r"(?<![\w-])\d{4}-\d{2}-\d{2}(?!\d)")
RESULTS_LINK = re.compile(r"\[[^\]\n]*\]\((?:\.\./)*bench/results/[^()\s]*\)")
LINK_TARGET = re.compile(r"(?<=\])\([^()\s]+\)")


def blank(match: re.Match[str]) -> str:
    """The matched text with every character but newlines turned to a space, so offsets and line numbers hold."""
    return re.sub(r"[^\n]", " ", match.group(0))


def prose(text: str) -> str:
    """The text with code fences, code spans, whole links to bench/results/ files and every link target blanked."""
    for pattern in (FENCE, CODE_SPAN, RESULTS_LINK, LINK_TARGET):
        text = pattern.sub(blank, text)
    return text


def present_tense_pages() -> list[Path]:
    """README.md and docs/: what is true now. bench/results/README.md alone holds the dated history."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_speak_in_the_present_tense() -> None:
    """No narration of work periods ("the sixteenth session", "last session") anywhere in the pages, and no ISO date
    in their prose (a date may stand only in a link to a results file whose name holds it). The before-stop hook's
    regex (`(first|...|twentieth|last|this|next|previous|earlier|later|two|three) sessions?`) is a subset of this."""
    found = []
    for path in present_tense_pages():
        text = path.read_text()
        for pattern, what, where in ((WORK_PERIOD, "work period", text), (ISO_DATE, "date in prose", prose(text))):
            for m in pattern.finditer(where):
                line = where.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {what}: {' '.join(m.group(0).split())!r}")
    assert found == [], "history belongs in bench/results/README.md, dated:\n" + "\n".join(found)
