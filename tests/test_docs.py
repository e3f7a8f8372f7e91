"""README.md and the code say the same thing: the oracle table is the oracle modules' own INFO text."""

from __future__ import annotations

import re

from convcheck.oracles import oracles_markdown
from tests.helpers import ROOT


def test_readme_oracle_table_is_generated_from_the_modules() -> None:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- oracles:begin[^\n]*-->\n(.*?)<!-- oracles:end -->", text, re.S)
    assert match, "README.md lost its oracles:begin / oracles:end markers"
    assert match.group(1) == oracles_markdown(), "run `convcheck oracles --markdown` and paste it into README.md"


def test_readme_opens_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    assert "make demo" in head and "make test" in head
