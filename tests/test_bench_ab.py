"""bench/bench_live_ab.py's base package: another commit's convcheck, every import of its own pointed at itself."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_base_package_imports_only_itself(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bench_live_ab import BASE_PACKAGE, base_package
    finally:
        sys.path.remove(str(ROOT / "bench"))
    package = base_package("HEAD", tmp_path) / BASE_PACKAGE
    sources = {p.relative_to(package): p.read_text() for p in package.rglob("*.py")}
    assert Path("live/check.py") in sources and not (tmp_path / "convcheck").exists()
    stray = re.compile(r"^\s*(from convcheck[. ]|import convcheck\b)", re.MULTILINE)
    assert [str(p) for p, text in sources.items() if stray.search(text)] == []
    assert "from convcheck_base.live.agreement import run_agreed" in sources[Path("live/check.py")]
