"""The launcher side finds or builds fixtures without importing torch or transformers: a cached built-in fixture is
found by its key alone, anything else is built by a child process (convcheck.fixtures.child)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from convcheck.errors import BadInput
from convcheck.fixtures.folders import config_folder
from tests.support.helpers import ROOT

HEAVY = ("torch", "megatron", "transformers", "safetensors", "numpy")


@pytest.mark.fresh_process
def test_the_launcher_builds_fixtures_without_importing_a_heavy_library(tmp_path: Path) -> None:
    """A fresh cache: the launcher's resolve of a built-in fixture and of a config.json (what `verify` does before any
    rank starts) leaves the building to a child process; the launcher imports neither torch nor transformers, and
    the second resolve of the built-in fixture finds it in the cache."""
    config = ROOT / "tests" / "data" / "qwen3-30b-a3b.config.json"
    code = (
        "import sys; from convcheck import api; "
        "folders = [api.resolve_model('tiny:qwen3'), api.resolve_model('config:' + sys.argv[1], 2), "
        "api.resolve_model('tiny:qwen3')]; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})); print(folders)"
    )
    env = {**os.environ, "CONVCHECK_CACHE_DIR": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, cwd=ROOT,
                         env=env, check=True)  # fmt: skip
    heavy, listed = res.stdout.strip().splitlines()
    folders = ast.literal_eval(listed)
    assert heavy == "[]", heavy
    assert folders[0] == folders[2] and all((Path(f) / ".complete").exists() for f in folders), folders


@pytest.mark.fresh_process
def test_a_config_the_child_refuses_is_bad_input_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "no-such-family"}')
    with pytest.raises(BadInput, match="no-such-family"):
        config_folder(str(bad))
