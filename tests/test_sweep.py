"""`convcheck sweep` / `convcheck digest`: byte identity of two checkpoints, planted differences named by tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from convcheck.errors import BadInput
from convcheck.hf.checkpoint import WINDOW, open_weights
from convcheck.hf.digest import FORMAT, read_manifest, write_digest
from convcheck.hf.sweep import bytes_to_read, compare, open_side, sweep
from tests.support.helpers import run_cli

BIG = "model.embed_tokens.weight"
"""A bf16 tensor larger than one mapped window, so a difference past the first window is exercised."""


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    big = torch.randint(-(2**15), 2**15 - 1, (WINDOW // 2 // 1024 + 8, 1024), dtype=torch.int16, generator=g)
    return {
        BIG: big.view(torch.bfloat16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(64, 48, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(48, generator=g),
        "model.norm.weight": torch.ones(48, dtype=torch.bfloat16),
        "lm_head.weight": torch.randn(40, 48, generator=g).to(torch.bfloat16),
        "model.rotary.inv_freq": torch.arange(6, dtype=torch.int64),
    }


def _save(folder: Path, tensors: dict[str, torch.Tensor], shards: int = 2) -> Path:
    """An HF-style folder: `shards` safetensors files with model.safetensors.index.json, or one model.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, str(folder / fname))
        weight_map.update(dict.fromkeys(part, fname))
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": weight_map}))
    return folder


@pytest.fixture
def ref(tmp_path: Path) -> Path:
    return _save(tmp_path / "a", _tensors())


def _variant(tmp_path: Path, change) -> Path:  # type: ignore[no-untyped-def]
    tensors = {k: v.clone() for k, v in _tensors().items()}
    change(tensors)
    return _save(tmp_path / "b", tensors)


def _one_line_error(res, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert res.code == 2, (res.code, res.out, res.err)
    assert needle in res.err
    assert res.err.startswith("convcheck: error: ")
    assert len(res.err.strip().splitlines()) == 1, res.err
    assert "Traceback" not in res.err + res.out


def test_identical_checkpoints_pass(ref: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(ref, tmp_path / "copy")
    res = run_cli("sweep", str(ref), str(copy), "--json", str(tmp_path / "r.json"))
    assert res.code == 0, res.err
    assert res.out.startswith("PASS ") and "6 tensors in both" in res.out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "pass" and report["findings"] == []
    assert report["counts"]["tensors"] == 6
    assert report["counts"]["bytes"] == sum(t.numel() * t.element_size() for t in _tensors().values())


def test_flipped_bit_is_named_with_index_and_both_bit_patterns(ref: Path, tmp_path: Path) -> None:
    def flip(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.0.mlp.down_proj.weight"].view(torch.int16)[5, 7] ^= 1

    b = _variant(tmp_path, flip)
    res = run_cli("sweep", str(ref), str(b), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"))
    assert res.code == 1, res.err
    expected = _tensors()["model.layers.0.mlp.down_proj.weight"][5, 7]
    bits = int(expected.view(torch.int16)) & 0xFFFF
    line = next(ln for ln in res.out.splitlines() if "down_proj" in ln)
    assert "[bytes-differ] 1/3072 elements differ; first at index [5, 7]" in line
    assert f"expected {expected.item()!r} (0x{bits:04x})" in line and f"(0x{bits ^ 1:04x})" in line
    assert res.out.strip().splitlines()[-1].startswith("FAIL ")
    report = json.loads((tmp_path / "r.json").read_text())
    assert [(f["tensor"], f["kind"]) for f in report["findings"]] == [
        ("model.layers.0.mlp.down_proj.weight", "bytes-differ")
    ]
    assert report["findings"][0]["detail"]["first_index"] == [5, 7]
    junit = (tmp_path / "j.xml").read_text()
    assert junit.count("<testcase") == 1 and 'name="sweep"' in junit and "down_proj.weight: [bytes-differ]" in junit


def test_difference_past_the_first_window_has_its_global_index(ref: Path, tmp_path: Path) -> None:
    rows = _tensors()[BIG].shape[0]

    def flip(t: dict[str, torch.Tensor]) -> None:
        t[BIG].view(torch.int16)[rows - 3, 9] ^= 0x8000  # sign bit, in the second mapped window
        t[BIG].view(torch.int16)[rows - 1, 1000] ^= 0x0100

    result = sweep(ref, _variant(tmp_path, flip))
    (finding,) = result.findings
    assert (finding.tensor, finding.kind) == (BIG, "bytes-differ")
    assert finding.detail["first_index"] == [rows - 3, 9] and finding.detail["count"] == 2


def test_negative_zero_is_a_difference(tmp_path: Path) -> None:
    a = _save(tmp_path / "a", {"w": torch.zeros(4)}, shards=1)
    b = _save(tmp_path / "b", {"w": torch.tensor([0.0, -0.0, 0.0, 0.0])}, shards=1)
    (finding,) = sweep(a, b).findings
    assert finding.detail["first_index"] == [1] and "0x80000000" in finding.message


def test_missing_and_extra_tensors(ref: Path, tmp_path: Path) -> None:
    def change(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.0.mlp.up_proj.weight"] = t.pop("lm_head.weight")

    res = run_cli("sweep", str(ref), str(_variant(tmp_path, change)))
    assert res.code == 1
    assert "lm_head.weight: [missing] in A" in res.out
    assert "model.layers.0.mlp.up_proj.weight: [extra] in B" in res.out


def test_dtype_change(ref: Path, tmp_path: Path) -> None:
    def change(t: dict[str, torch.Tensor]) -> None:
        t["model.norm.weight"] = t["model.norm.weight"].float()

    res = run_cli("sweep", str(ref), str(_variant(tmp_path, change)))
    assert res.code == 1
    assert "model.norm.weight: [dtype] dtype F32, expected BF16" in res.out


def test_shape_change(ref: Path, tmp_path: Path) -> None:
    def change(t: dict[str, torch.Tensor]) -> None:
        t["lm_head.weight"] = t["lm_head.weight"].t().contiguous()

    res = run_cli("sweep", str(ref), str(_variant(tmp_path, change)))
    assert res.code == 1
    assert "lm_head.weight: [shape] shape [48, 40], expected [40, 48]" in res.out


def test_folder_against_single_file(ref: Path, tmp_path: Path) -> None:
    single = tmp_path / "single.safetensors"
    save_file(_tensors(), str(single))
    res = run_cli("sweep", str(ref), str(single))
    assert res.code == 0, res.out + res.err
    assert sweep(single, ref / "model.safetensors.index.json").verdict == "pass"


def test_digest_is_deterministic_and_format_independent(ref: Path, tmp_path: Path) -> None:
    one, two, three = tmp_path / "1.json", tmp_path / "2.json", tmp_path / "3.json"
    assert run_cli("digest", str(ref), "--out", str(one)).code == 0
    assert run_cli("digest", str(ref), "--out", str(two)).code == 0
    assert one.read_bytes() == two.read_bytes()
    save_file(_tensors(), str(tmp_path / "single.safetensors"))
    write_digest(tmp_path / "single.safetensors", three)
    assert three.read_bytes() == one.read_bytes()  # same tensors, other file layout: same manifest
    data = json.loads(one.read_text())
    assert data["format"] == FORMAT and data["hash"] == "sha256" and len(data["tensors"]) == 6
    assert data["tensors"]["lm_head.weight"]["shape"] == [40, 48]
    assert run_cli("digest", str(ref)).out == one.read_text()  # no --out: the manifest on stdout


def test_digest_against_folder(ref: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "ref.digest.json"
    write_digest(ref, manifest)
    res = run_cli("sweep", str(manifest), str(shutil.copytree(ref, tmp_path / "copy")))
    assert res.code == 0, res.out + res.err

    def flip(t: dict[str, torch.Tensor]) -> None:
        t[BIG].view(torch.int16)[-1, -1] ^= 4

    b = _variant(tmp_path, flip)
    res = run_cli("sweep", str(b), str(manifest), "--json", str(tmp_path / "r.json"))
    assert res.code == 1
    findings = json.loads((tmp_path / "r.json").read_text())["findings"]
    assert [(f["tensor"], f["kind"]) for f in findings] == [(BIG, "digest-differs")]
    assert f"{BIG}: [digest-differs] sha256" in res.out
    other = tmp_path / "b.digest.json"
    write_digest(b, other)
    assert [f.kind for f in sweep(manifest, other).findings] == ["digest-differs"]
    assert sweep(manifest, manifest).verdict == "pass"


def test_findings_past_twenty_are_in_the_json_report(tmp_path: Path) -> None:
    a = _save(tmp_path / "a", {"w": torch.zeros(2)}, shards=1)
    b = _save(tmp_path / "b", {"w": torch.zeros(2), **{f"extra.{i:02d}": torch.zeros(1) for i in range(25)}}, shards=1)
    res = run_cli("sweep", str(a), str(b), "--json", str(tmp_path / "r.json"))
    assert res.code == 1
    assert sum(ln.startswith("FAIL sweep: ") for ln in res.out.splitlines()) == 20
    assert "... 5 more in the JSON report" in res.out
    assert len(json.loads((tmp_path / "r.json").read_text())["findings"]) == 25
    quiet = run_cli("sweep", str(a), str(b), "--quiet")
    assert quiet.code == 1 and len(quiet.out.strip().splitlines()) == 1


def _truncate(folder: Path) -> str:
    shard = min(folder.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    return "truncated safetensors file"


def _not_a_checkpoint(folder: Path) -> str:
    shutil.rmtree(folder)
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    return "no safetensors weights in"


@pytest.mark.parametrize("damage", [_truncate, _not_a_checkpoint])
def test_bad_checkpoint_is_bad_input(ref: Path, tmp_path: Path, damage) -> None:  # type: ignore[no-untyped-def]
    b = shutil.copytree(ref, tmp_path / "b")
    needle = damage(b)
    report = tmp_path / "r.json"
    report.write_text("keep me")
    _one_line_error(run_cli("sweep", str(ref), str(b), "--json", str(report)), needle)
    assert report.read_text() == "keep me"
    _one_line_error(run_cli("digest", str(b), "--out", str(report)), needle)
    assert report.read_text() == "keep me"


def test_unknown_manifest_format_is_bad_input(ref: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    write_digest(ref, manifest)
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "format": "convcheck-digest/99"}))
    _one_line_error(run_cli("sweep", str(ref), str(manifest)), "is not a convcheck digest manifest")
    manifest.write_text(json.dumps({**data, "hash": "crc32"}))
    _one_line_error(run_cli("sweep", str(ref), str(manifest)), "unsupported hash 'crc32'")
    data["tensors"]["lm_head.weight"]["digest"] = "abc"
    manifest.write_text(json.dumps(data))
    with pytest.raises(BadInput, match="bad entry for tensor 'lm_head.weight'"):
        read_manifest(manifest)


def test_report_into_a_missing_folder_is_bad_input(ref: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "r.json"
    _one_line_error(run_cli("sweep", str(ref), str(ref), "--json", str(missing)), "output folder does not exist")
    _one_line_error(run_cli("sweep", str(ref), str(ref), "--junit", str(missing)), "output folder does not exist")
    _one_line_error(run_cli("digest", str(ref), "--out", str(missing)), "output folder does not exist")
    _one_line_error(run_cli("sweep", str(ref), str(tmp_path / "absent")), "not found:")
    assert not missing.parent.exists()


def test_open_weights_needs_no_config(ref: Path) -> None:
    weights = open_weights(ref)
    assert weights.config == {} and len(weights.tensors) == 6
    entry = weights.tensors["lm_head.weight"]
    assert entry.nbytes == 40 * 48 * 2 and entry.offset > 8


def test_manifests_with_other_hashes(ref: Path, tmp_path: Path) -> None:
    ours = tmp_path / "sha256.json"
    write_digest(ref, ours)
    data = json.loads(ours.read_text())
    other = tmp_path / "sha512.json"
    wrong = {n: {**e, "digest": "0" * 128} for n, e in data["tensors"].items()}
    other.write_text(json.dumps({**data, "hash": "sha512", "tensors": wrong}))
    _one_line_error(run_cli("sweep", str(ours), str(other)), "cannot compare digests")
    result = sweep(ref, other)  # the folder side is hashed with the manifest's algorithm
    assert {f.kind for f in result.findings} == {"digest-differs"} and len(result.findings) == 6
    assert result.findings[0].detail["hash"] == "sha512"


def test_progress_counts_every_byte_read(ref: Path, tmp_path: Path) -> None:
    a, b = open_side(ref), open_side(shutil.copytree(ref, tmp_path / "copy"))
    seen: list[int] = []
    result = compare(a, b, progress=seen.append, workers=2)
    assert sum(seen) == result.bytes_read == bytes_to_read(a, b) == 2 * result.bytes
