"""No verdict rests on state from an earlier run: the layout oracle's cached TP1 manifest is keyed by the content
of the code that made it, so editing the bridge (same version string) between runs gives every run the right
verdict."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from convcheck.engine.warm_client import serving
from convcheck.fork.client import SOCKET_ENV
from tests.support.helpers import ROOT, run_cli

BUG = """

_convcheck_original_stream = MegatronModelBridge.stream_weights_megatron_to_hf


def _convcheck_scaled_norm(self, *args, **kwargs):
    for name, tensor in _convcheck_original_stream(self, *args, **kwargs):
        yield name, (tensor * FACTOR if name == "model.norm.weight" else tensor)


MegatronModelBridge.stream_weights_megatron_to_hf = _convcheck_scaled_norm
"""


@pytest.mark.ranks
def test_an_edited_bridge_never_reuses_a_stale_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each branch's runs fork their ranks from a warm server started on that branch's code (the session's server
    imported the installed bridge; a server's forks never see an edit made after it started)."""
    overlay = tmp_path / "overlay"
    bridge = Path(importlib.util.find_spec("megatron.bridge").origin).parent  # type: ignore[union-attr, arg-type]
    shutil.copytree(bridge, overlay / "megatron" / "bridge")
    module = overlay / "megatron" / "bridge" / "models" / "conversion" / "model_bridge.py"
    healthy = module.read_text()
    env = {"PYTHONPATH": os.pathsep.join([str(overlay), str(ROOT)]), "CONVCHECK_CACHE_DIR": str(tmp_path / "cache")}
    args = ("verify", "--model", "tiny:qwen3", "--tp", "2", "--oracle", "roundtrip,layout")
    manifests = tmp_path / "cache" / "layout"

    monkeypatch.delenv(SOCKET_ENV, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for factor in (2, 3):  # two bridge branches with an export bug, same version string
        module.write_text(healthy + BUG.replace("FACTOR", str(factor)))
        with serving(wait_s=240):
            buggy = run_cli(*args, tmp_path=tmp_path, env=env)
        assert buggy.code == 1, buggy.err
        assert {f["tensor"] for f in buggy.findings("roundtrip")} == {"model.norm.weight"}
        # the bug is the same at TP1 and TP2: the TP1 job (run because TP2 differs from the source) exports the same
        # bytes; a stale manifest from the x2 branch would have called the x3 branch layout-dependent
        assert {(f["tensor"], f["kind"]) for f in buggy.findings("layout")} == {
            ("model.norm.weight", "tp1-differs-from-source")
        }
        assert len(list(manifests.glob("*.json"))) == 1  # the stale manifest was replaced
