"""Session-wide fixtures; the helpers tests import live in tests/helpers.py."""

from __future__ import annotations

import os

import pytest

from tests.helpers import ROOT


@pytest.fixture(scope="session", autouse=True)
def _cache_dir() -> None:
    """Use the repo's cache (set by the Makefile) or a private one, never the user's home."""
    os.environ.setdefault("CONVCHECK_CACHE_DIR", str(ROOT / ".cache"))
