"""NemotronH (Mamba + attention + MLP + MoE) through the real bridge: strict names and a planted Mamba layout bug."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from convcheck.fixtures.build import build_fixture
from tests.support.helpers import mutant, run_cli

EXTRA = "backbone.layers.0.mixer.extra_proj.weight"


def _copy_with(tmp_path: Path, *, extra: bool, transformers_embedding_name: bool) -> Path:
    """A copy of tiny:nemotron-h with an extra tensor and/or the embedding under transformers' save name."""
    folder = tmp_path / "ckpt"
    shutil.copytree(build_fixture("tiny:nemotron-h"), folder)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    if transformers_embedding_name:
        from safetensors.torch import load_file

        shard = index["weight_map"].pop("backbone.embeddings.weight")
        tensors = load_file(str(folder / shard))
        tensors["backbone.embedding.weight"] = tensors.pop("backbone.embeddings.weight")
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        index["weight_map"]["backbone.embedding.weight"] = shard
    if extra:
        save_file({EXTRA: torch.ones(4, 4, dtype=torch.bfloat16)}, str(folder / "extra.safetensors"))
        index["weight_map"][EXTRA] = "extra.safetensors"
    index_path.write_text(json.dumps(index))
    return folder


@pytest.mark.ranks
def test_unmapped_checkpoint_names_fail_coverage_by_name(tmp_path: Path) -> None:
    """An extra tensor and transformers' `backbone.embedding.weight` (the bridge maps `embeddings`) both fail."""
    folder = _copy_with(tmp_path, extra=True, transformers_embedding_name=True)
    res = run_cli("verify", "--model", str(folder), "--oracle", "coverage", tmp_path=tmp_path)
    assert res.code == 1, res.err
    kinds = {(f["tensor"], f["kind"]) for f in res.findings("coverage")}
    assert (EXTRA, "not-exported") in kinds
    assert ("backbone.embedding.weight", "not-exported") in kinds
    assert ("embedding.word_embeddings.weight", "hf-missing") in kinds
    assert ("embedding.word_embeddings.weight", "not-loaded") in kinds  # the NaN sentinel survived the import


@pytest.mark.ranks
def test_dt_before_bc_passes_roundtrip_but_not_mapping(tmp_path: Path) -> None:
    """Symmetric bug in the real MambaInProjMapping: invisible to roundtrip, named by the mapping oracle."""
    res = run_cli("verify", "--model", "tiny:nemotron-h", "--tp", "2", "--oracle", "roundtrip,mapping",
                  "--hook", mutant("mamba", "dt_before_bc"), tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.err
    assert res.verdicts() == {"roundtrip": "pass", "mapping": "fail"}
    findings = res.findings("mapping")
    kinds = {(f["tensor"], f["kind"]) for f in findings}
    assert kinds == {(f"decoder.layers.{i}.mixer.in_proj.weight", "import-bytes-differ") for i in (0, 3)} | {
        (f"backbone.layers.{i}.mixer.in_proj.weight", "export-bytes-differ") for i in (0, 3)
    }
    first = next(f for f in findings if f["kind"] == "import-bytes-differ")
    assert first["detail"]["first_index"] == [32, 0]  # the row after z_r, x_r (16 rows each at TP2)
