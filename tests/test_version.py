"""Version folders: manifest format, index consistency and digests without ranks; write and check with ranks.

Planted bugs: a shard missing from the index, a digest that disagrees, an export from another step than the
checkpoint (and tests/test_distckpt.py: a key dropped on restore).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from convcheck.errors import BadInput
from tests.support.helpers import run_cli


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A version folder written without ranks from the tiny:qwen3 fixture (its tensors as the export), >= 3 shards."""
    from convcheck.api import resolve_model
    from convcheck.ckpt.manifest import VersionManifest
    from convcheck.ckpt.shards import ShardWriter
    from convcheck.hf.checkpoint import open_checkpoint
    from convcheck.hf.tensors import TensorReader
    from convcheck.layout import ParallelLayout

    out = tmp_path_factory.mktemp("version")
    source = open_checkpoint(resolve_model("tiny:qwen3"))
    reader = TensorReader(source)
    writer = ShardWriter(out, max_shard_bytes=20_000)
    for name in sorted(source.tensors):
        writer.add(name, reader.get(name))
    writer.close()
    manifest = VersionManifest(step=5, layout=ParallelLayout(tp=2), model="tiny:qwen3", tensors=dict(writer.digests))
    (out / "manifest.json").write_text(manifest.to_json())
    return out


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "v"
    shutil.copytree(folder, target)
    return target


def _checks(folder: Path) -> list[tuple[str, str]]:
    from convcheck.ckpt.folder import check_index, check_manifest
    from convcheck.ckpt.manifest import read_version_manifest

    manifest = read_version_manifest(folder / "manifest.json")
    structure = check_index(folder, manifest.index)
    _, findings = check_manifest(folder, manifest, structure)
    return [(f.tensor, f.kind) for f in (*structure.findings, *findings)]


def test_shards_hold_the_exact_bytes(folder: Path) -> None:
    from safetensors.torch import load_file

    from convcheck.api import resolve_model
    from convcheck.compare.bits import int_view
    from convcheck.hf.checkpoint import open_checkpoint
    from convcheck.hf.tensors import TensorReader

    source = open_checkpoint(resolve_model("tiny:qwen3"))
    reader = TensorReader(source)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(folder.glob("*.safetensors"))
    count = len(shards)
    assert count >= 3 and [p.name for p in shards] == [
        f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)
    ]
    seen = {}
    for shard in shards:
        for name, tensor in load_file(str(shard)).items():
            want = reader.get(name)
            assert tensor.dtype == want.dtype and tensor.shape == want.shape
            assert bool((int_view(tensor) == int_view(want)).all()), name
            seen[name] = shard.name
    assert seen == index["weight_map"] and set(seen) == set(source.tensors)
    assert index["metadata"]["total_size"] == sum(e.nbytes for e in source.tensors.values())


def test_manifest_format_round_trips(folder: Path) -> None:
    from convcheck.ckpt.manifest import FORMAT, read_version_manifest

    text = (folder / "manifest.json").read_text()
    data = json.loads(text)
    assert data["format"] == FORMAT == "convcheck-version/1"
    assert (
        data["step"] == 5
        and data["layout"]["tp"] == 2
        and data["checkpoint"] == {"path": "ckpt", "format": "torch_dist"}
    )
    assert data["hash"] == "sha256" and all(set(e) == {"dtype", "shape", "digest"} for e in data["tensors"].values())
    assert read_version_manifest(folder / "manifest.json").to_json() == text
    assert _checks(folder) == []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format="convcheck-digest/1"), "is not a version manifest"),
        (lambda d: d.update(step=-1), "'step' must be a non-negative integer"),
        (lambda d: d.update(layout="tp2"), "'layout' must be an object"),
        (lambda d: d.update(hash="md5"), "unsupported hash"),
        (lambda d: d["tensors"]["lm_head.weight"].update(digest="xyz"), "bad entry for tensor 'lm_head.weight'"),
    ],
)
def test_bad_manifest_is_bad_input(folder: Path, tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    from convcheck.ckpt.manifest import read_version_manifest

    data = json.loads((folder / "manifest.json").read_text())
    edit(data)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BadInput, match=message):
        read_version_manifest(tmp_path / "manifest.json")


def test_shard_missing_from_the_index_is_named(folder: Path, tmp_path: Path) -> None:
    from convcheck.mutants.checkpoint import unindex_shard

    target = _copy(folder, tmp_path)
    shard = unindex_shard(target)
    found = _checks(target)
    assert (shard, "unindexed-shard") in found
    assert ("model.norm.weight", "not-in-index") in found  # the last shard's tensors, each named


def test_shard_file_missing_and_tensor_in_two_shards_are_named(folder: Path, tmp_path: Path) -> None:
    from convcheck.ckpt.folder import check_index

    target = _copy(folder, tmp_path)
    second = sorted(target.glob("*.safetensors"))[1]
    second.unlink()
    structure = check_index(target, "model.safetensors.index.json")
    assert (second.name, "missing-shard") in [(f.tensor, f.kind) for f in structure.findings]
    assert not structure.loadable
    target = _copy(folder, tmp_path / "b")
    first = sorted(target.glob("*.safetensors"))[0]
    shutil.copy(first, target / "extra.safetensors")
    found = [(f.tensor, f.kind) for f in check_index(target, "model.safetensors.index.json").findings]
    assert ("lm_head.weight", "duplicate") in found and ("extra.safetensors", "unindexed-shard") in found


def test_digest_that_disagrees_is_named(folder: Path, tmp_path: Path) -> None:
    from convcheck.mutants.checkpoint import corrupt_digest

    target = _copy(folder, tmp_path)
    name = corrupt_digest(target)
    assert _checks(target) == [(name, "digest-differs")]


def test_sweep_reads_a_version_manifest(folder: Path, tmp_path: Path) -> None:
    """`convcheck sweep` takes a version folder's manifest.json like a digest manifest: equal, then one flipped byte."""
    from convcheck.hf.sweep import sweep

    assert sweep(folder / "manifest.json", folder).findings == ()
    target = _copy(folder, tmp_path)
    data = json.loads((target / "manifest.json").read_text())
    name = sorted(data["tensors"])[3]
    digest = data["tensors"][name]["digest"]
    data["tensors"][name]["digest"] = ("0" if digest[0] != "0" else "1") + digest[1:]
    (target / "manifest.json").write_text(json.dumps(data))
    assert [f.tensor for f in sweep(target / "manifest.json", folder).findings] == [name]


def test_truncated_shard_is_named(folder: Path, tmp_path: Path) -> None:
    target = _copy(folder, tmp_path)
    shard = sorted(target.glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-10])
    found = _checks(target)
    assert (shard.name, "corrupt-shard") in found
    assert ("model.norm.weight", "missing") in found


def test_cli_bad_input_is_one_line(folder: Path, tmp_path: Path) -> None:
    r = run_cli("version", "check", str(tmp_path / "nowhere"))
    assert r.code == 2 and "version folder not found" in r.err and len(r.err.strip().splitlines()) == 1
    r = run_cli("version", "write", str(folder), "--model", "tiny:qwen3")
    assert r.code == 2 and "already exists and is not empty" in r.err and len(r.err.strip().splitlines()) == 1
    (tmp_path / "v").mkdir()
    r = run_cli("version", "check", str(tmp_path / "v"))
    assert r.code == 2 and "no manifest.json" in r.err


# --- with ranks: write at PP2, check at TP1 (PP2 -> PP1), and an export from another step ----------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("written") / "v100"
    r = run_cli("version", "write", str(target), "--model", "tiny:qwen3", "--layout", "pp2", "--step", "100",
                "--max-shard-size", "20KB")  # fmt: skip
    assert r.code == 0, r.err
    assert r.out.startswith(f"wrote {target}: 25 tensors") and "torch_dist at PP2" in r.out
    return target


@pytest.mark.ranks
def test_written_folder_checks_at_another_layout(written: Path, tmp_path: Path) -> None:
    assert sorted(p.name for p in written.iterdir() if p.is_file() and not p.name.startswith("model-")) == [
        "config.json", "generation_config.json", "manifest.json", "model.safetensors.index.json"
    ]  # fmt: skip
    assert (written / "ckpt" / "metadata.json").is_file() and len(list(written.glob("model-*.safetensors"))) > 1
    manifest = json.loads((written / "manifest.json").read_text())
    assert manifest["step"] == 100 and manifest["layout"]["pp"] == 2
    r = run_cli("version", "check", str(written), "--layout", "tp1", "--json", str(tmp_path / "r.json"))
    assert r.code == 0, r.out + r.err
    report = json.loads((tmp_path / "r.json").read_text())
    checks = {o["name"]: o for o in report["oracles"]}
    assert [o["verdict"] for o in checks.values()] == ["pass"] * 3
    assert checks["checkpoint"]["checked"] == 25 and checks["checkpoint"]["metrics"]["resumed_at"] == "TP1"


@pytest.mark.ranks
def test_export_from_another_step_is_named(written: Path, tmp_path: Path) -> None:
    from convcheck.mutants.checkpoint import export_from_other_step

    target = tmp_path / "v"
    shutil.copytree(written, target)
    changed = export_from_other_step(target)
    r = run_cli("version", "check", str(target), "--json", str(tmp_path / "r.json"))
    assert r.code == 1, r.err
    report = json.loads((tmp_path / "r.json").read_text())
    checks = {o["name"]: o for o in report["oracles"]}
    assert checks["index"]["verdict"] == checks["manifest"]["verdict"] == "pass"  # a consistent, wrong export
    found = {(f["tensor"], f["kind"]) for f in checks["checkpoint"]["findings"]}
    assert ("<step>", "step-differs") in found
    assert {(n, "bytes-differ") for n in changed} <= found and len(changed) == 25
