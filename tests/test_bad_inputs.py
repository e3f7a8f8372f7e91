"""Bad-input corpus: malformed or hostile checkpoints and options, each built on the fly in a path with spaces.

Every case ends in exit 2 with one `convcheck: error:` line naming the file and tensor (or exit 0 where the input is
merely unusual: NaN weights, a symlinked folder, two runs at once), with no traceback, no hang, no report file on
exit 2 and the checkpoint folder unchanged. Validation cases fail in `api.prepare`, before torchrun starts; the few
that launch ranks are marked `ranks`.

Unreadable files: every test runs as root here, so chmod 000 proves nothing. The cases that cannot be read are a
directory named like a shard and a FIFO named like a checkpoint file (reading a FIFO would block forever): both are
refused from their stat mode before anything is opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from convcheck import api
from convcheck.errors import BadInput
from convcheck.fixtures.build import build_fixture
from tests.support.helpers import ROOT, mutant

INDEX = "model.safetensors.index.json"
SHARD1, SHARD2, SHARD3 = (f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))


# --- safetensors files written by hand -------------------------------------------------------------------------


def read_st(path: Path) -> tuple[dict[str, Any], bytes]:
    """(header, data bytes) of a safetensors file."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + size]), raw[8 + size :]


def write_st(path: Path, header: dict[str, Any] | bytes, data: bytes) -> None:
    """Write a header (a dict, or raw header bytes) and data bytes as a safetensors file."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def tensors_of(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, raw bytes) in file order."""
    header, data = read_st(path)
    entries = sorted((v["data_offsets"][0], k, v) for k, v in header.items() if k != "__metadata__")
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0] : v["data_offsets"][1]]) for _, k, v in entries}


def pack(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """Write `tensors` as a well-formed safetensors file (byte ranges tiling the data)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    write_st(path, header, data)


def edit_header(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply `change` to a file's header, keeping its data bytes."""
    header, data = read_st(path)
    change(header)
    write_st(path, header, data)


def edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (not following links, never opening FIFOs): kind and content digest."""
    out = {}
    for path in sorted(folder.rglob("*")):
        mode = path.lstat().st_mode
        rel = str(path.relative_to(folder))
        if stat.S_ISLNK(mode):
            out[rel] = f"link:{os.readlink(path)}"
        elif stat.S_ISREG(mode):
            out[rel] = "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = f"mode:{stat.S_IFMT(mode)}"
    return out


# --- the corpus -------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """What a damaged input must produce: `needle` in the one stderr line (exit 2)."""

    needle: str
    model: Path | None = None
    """The --model path when it is not the damaged folder itself."""
    layout: str | None = None
    """A layout spelled for api.prepare ("tp3"); the CLI gets it as options."""
    json_path: Path | None = None
    """The --json target when it is not the default one (in an existing folder)."""
    in_prepare: bool = True
    """False where the CLI rejects the option itself, before api.prepare."""

    @property
    def args(self) -> tuple[str, ...]:
        """The layout as CLI options."""
        if not self.layout:
            return ()
        from convcheck.layout import ParallelLayout

        grid = ParallelLayout.parse(self.layout)
        return tuple(grid.cli_args())


def truncated_shard(ckpt: Path) -> Case:
    shard = ckpt / SHARD3
    shard.write_bytes(shard.read_bytes()[:-40])  # into the last tensor's 64 bytes
    needle = "tensor 'model.norm.weight' ends at data byte 18112, past the 18072 data bytes the file holds"
    return Case(f"truncated safetensors file {shard}: {needle}")


def empty_shard(ckpt: Path) -> Case:
    (ckpt / SHARD2).write_bytes(b"")
    return Case(f"corrupt safetensors file {ckpt / SHARD2}: shorter than its 8-byte header length")


def corrupt_header_json(ckpt: Path) -> Case:
    shard = ckpt / SHARD1
    data = bytearray(shard.read_bytes())
    data[8:16] = b"\x00garbage"
    shard.write_bytes(bytes(data))
    return Case(f"corrupt safetensors file {shard}: header is not valid JSON")


def header_not_an_object(ckpt: Path) -> Case:
    write_st(ckpt / SHARD1, b"[1, 2, 3]", b"")
    return Case(f"corrupt safetensors file {ckpt / SHARD1}: header is not a JSON object")


def header_length_past_end_of_file(ckpt: Path) -> Case:
    shard = ckpt / SHARD1
    data = bytearray(shard.read_bytes())
    data[:8] = struct.pack("<Q", 1 << 40)
    shard.write_bytes(bytes(data))
    return Case(f"corrupt safetensors file {shard}: header length {1 << 40} exceeds the file")


def offsets_past_end_of_file(ckpt: Path) -> Case:
    def change(header: dict[str, Any]) -> None:
        header["model.norm.weight"]["data_offsets"] = [18112, 18176]  # 64 bytes, just past the data's end

    edit_header(ckpt / SHARD3, change)
    return Case("tensor 'model.norm.weight' ends at data byte 18176, past the 18112 data bytes the file holds")


def overlapping_byte_ranges(ckpt: Path) -> Case:
    def change(header: dict[str, Any]) -> None:  # q_norm claims k_norm's 16 bytes (same dtype and shape)
        header["model.layers.0.self_attn.q_norm.weight"]["data_offsets"] = list(
            header["model.layers.0.self_attn.k_norm.weight"]["data_offsets"]
        )

    edit_header(ckpt / SHARD1, change)
    return Case("tensors 'model.layers.0.self_attn.k_norm.weight' and 'model.layers.0.self_attn.q_norm.weight' overlap")


def bytes_of_no_tensor(ckpt: Path) -> Case:
    edit_header(ckpt / SHARD1, lambda h: h.pop("model.layers.0.self_attn.k_norm.weight"))
    return Case(f"corrupt safetensors file {ckpt / SHARD1}: data bytes 13824-13840 belong to no tensor")


def bytes_after_the_last_tensor(ckpt: Path) -> Case:
    with open(ckpt / SHARD2, "ab") as fh:
        fh.write(b"\x00" * 16)
    return Case(f"corrupt safetensors file {ckpt / SHARD2}: 16 bytes after the last tensor's data")


def byte_count_disagrees_with_shape(ckpt: Path) -> Case:
    edit_header(ckpt / SHARD3, lambda h: h["model.norm.weight"].update(shape=[16]))
    return Case("tensor 'model.norm.weight' has 64 bytes, needs 32 (BF16 [16])")


def unknown_dtype(ckpt: Path) -> Case:
    edit_header(ckpt / SHARD3, lambda h: h["model.norm.weight"].update(dtype="F12"))
    return Case(f"corrupt safetensors file {ckpt / SHARD3}: tensor 'model.norm.weight' has unknown dtype 'F12'")


def negative_dimension(ckpt: Path) -> Case:
    edit_header(ckpt / SHARD3, lambda h: h["model.norm.weight"].update(shape=[-32]))
    return Case("tensor 'model.norm.weight' has shape [-32], not a list of non-negative integers")


def offsets_not_integers(ckpt: Path) -> Case:
    edit_header(ckpt / SHARD3, lambda h: h["model.norm.weight"].update(data_offsets=["18048", 18112]))
    return Case("tensor 'model.norm.weight' has data_offsets ['18048', 18112], not two non-negative integers")


def header_entry_without_dtype(ckpt: Path) -> Case:
    edit_header(ckpt / SHARD3, lambda h: h["model.norm.weight"].pop("dtype"))
    return Case("tensor 'model.norm.weight' has a bad header entry (needs dtype, shape and data_offsets)")


def tensor_named_twice_in_one_header(ckpt: Path) -> Case:
    header, data = read_st(ckpt / SHARD3)
    text = json.dumps(header)
    entry = json.dumps({"model.norm.weight": header["model.norm.weight"]})[1:-1]
    write_st(ckpt / SHARD3, (text[:-1] + ", " + entry + "}").encode(), data)
    return Case(f"corrupt safetensors file {ckpt / SHARD3}: the header names 'model.norm.weight' twice")


def metadata_not_strings(ckpt: Path) -> Case:
    edit_header(ckpt / SHARD2, lambda h: h.update(__metadata__={"format": "pt", "total": 3}))
    return Case(f"corrupt safetensors file {ckpt / SHARD2}: __metadata__ must map strings to strings")


def index_names_a_missing_shard(ckpt: Path) -> Case:
    (ckpt / SHARD2).unlink()
    return Case(f"missing shard {SHARD2} named by {INDEX} in {ckpt}")


def index_and_shard_disagree(ckpt: Path) -> Case:
    edit_json(ckpt / INDEX, lambda d: d["weight_map"].update({"model.norm.weight": SHARD1}))
    return Case(f"{INDEX} says 'model.norm.weight' is in {SHARD1}, but that shard does not hold it")


def shard_tensor_missing_from_index(ckpt: Path) -> Case:
    edit_json(ckpt / INDEX, lambda d: d["weight_map"].pop("model.norm.weight"))
    return Case(f"shard {SHARD3} holds tensor 'model.norm.weight', which {INDEX} in {ckpt} does not list")


def tensor_in_two_shards(ckpt: Path) -> Case:
    first = tensors_of(ckpt / SHARD1)
    first["model.norm.weight"] = tensors_of(ckpt / SHARD3)["model.norm.weight"]
    pack(ckpt / SHARD1, first)
    return Case(f"tensor 'model.norm.weight' appears in both {SHARD1} and {SHARD3}")


def index_is_not_json(ckpt: Path) -> Case:
    (ckpt / INDEX).write_text('{"weight_map": ')
    return Case(f"{ckpt / INDEX} is not a valid safetensors index (no weight_map)")


def index_weight_map_not_a_mapping(ckpt: Path) -> Case:
    edit_json(ckpt / INDEX, lambda d: d.update(weight_map=[SHARD1, SHARD2, SHARD3]))
    return Case(f"{ckpt / INDEX} is not a valid safetensors index (weight_map must map names to shard files)")


def index_points_outside_the_folder(ckpt: Path) -> Case:
    outside = ckpt.parent / "outside.safetensors"  # a readable, well-formed shard next to the folder
    shutil.copy(ckpt / SHARD1, outside)
    edit_json(ckpt / INDEX, lambda d: d["weight_map"].update({k: "../outside.safetensors" for k, v in
                                                              d["weight_map"].items() if v == SHARD1}))  # fmt: skip
    return Case("'../outside.safetensors', outside the checkpoint folder")


def zero_length_tensor(ckpt: Path) -> Case:
    last = tensors_of(ckpt / SHARD3)
    last["model.norm.weight"] = ("BF16", [0], b"")
    pack(ckpt / SHARD3, last)
    return Case(f"tensor 'model.norm.weight' in {SHARD3} has no elements (shape [0])")


def config_and_weights_disagree(ckpt: Path) -> Case:
    edit_json(ckpt / "config.json", lambda c: c.update(intermediate_size=48))
    return Case(
        f"config/weights shape mismatch: tensor 'model.layers.0.mlp.down_proj.weight' in {SHARD2} has shape [32, 64], "
        "but config.json (hidden_size=32, intermediate_size=48) implies [32, 48]"
    )


def vocab_and_embedding_disagree(ckpt: Path) -> Case:
    edit_json(ckpt / "config.json", lambda c: c.update(vocab_size=160))
    return Case("tensor 'lm_head.weight' in model-00003-of-00003.safetensors has shape [152, 32], but config.json "
                "(vocab_size=160, hidden_size=32) implies [160, 32]")  # fmt: skip


def pytorch_bin_only(ckpt: Path) -> Case:
    for path in [ckpt / INDEX, *ckpt.glob("*.safetensors")]:
        path.unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a pickle")
    return Case(f"no safetensors weights in {ckpt}, only pickled torch weights (pytorch_model.bin)")


def no_config(ckpt: Path) -> Case:
    (ckpt / "config.json").unlink()
    return Case(f"no config.json in {ckpt}")


def config_without_architectures(ckpt: Path) -> Case:
    edit_json(ckpt / "config.json", lambda c: c.pop("architectures"))
    return Case(f"config.json in {ckpt} names no architecture ('architectures' is missing)")


def config_not_json(ckpt: Path) -> Case:
    (ckpt / "config.json").write_text("{'architectures': ['Qwen3ForCausalLM']}")
    return Case(f"config.json in {ckpt} is not valid JSON")


def architectures_not_a_list(ckpt: Path) -> Case:
    edit_json(ckpt / "config.json", lambda c: c.update(architectures="Qwen3ForCausalLM"))
    return Case("'architectures' must be a list of class names, got 'Qwen3ForCausalLM'")


def config_is_a_directory(ckpt: Path) -> Case:
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").mkdir()
    return Case(f"config.json in {ckpt} is not a regular file (it is a directory)")


def config_is_a_fifo(ckpt: Path) -> Case:
    (ckpt / "config.json").unlink()
    os.mkfifo(ckpt / "config.json")
    return Case(f"config.json in {ckpt} is not a regular file (it is a FIFO)")


def shard_is_a_directory(ckpt: Path) -> Case:
    (ckpt / SHARD2).unlink()
    (ckpt / SHARD2).mkdir()
    return Case(f"safetensors file {ckpt / SHARD2} is not a regular file (it is a directory)")


def single_file_is_a_fifo(ckpt: Path) -> Case:
    for path in [ckpt / INDEX, *ckpt.glob("*.safetensors")]:
        path.unlink()
    os.mkfifo(ckpt / "model.safetensors")
    return Case(f"safetensors file {ckpt / 'model.safetensors'} is not a regular file (it is a FIFO)")


def impossible_layout(ckpt: Path) -> Case:
    return Case("impossible layout TP3: tp=3 does not divide num_attention_heads=4", layout="tp3")


def model_folder_missing(ckpt: Path) -> Case:
    return Case(f"model directory not found: {ckpt.parent / 'no such model'}", model=ckpt.parent / "no such model")


def model_path_is_a_file(ckpt: Path) -> Case:
    return Case(f"model path is not a directory: {ckpt / 'config.json'}", model=ckpt / "config.json")


def json_into_a_missing_folder(ckpt: Path) -> Case:
    target = ckpt.parent / "missing folder" / "report.json"
    return Case("output folder does not exist", json_path=target, in_prepare=False)


CASES = [
    truncated_shard, empty_shard, corrupt_header_json, header_not_an_object, header_length_past_end_of_file,
    offsets_past_end_of_file, overlapping_byte_ranges, bytes_of_no_tensor, bytes_after_the_last_tensor,
    byte_count_disagrees_with_shape, unknown_dtype, negative_dimension, offsets_not_integers,
    header_entry_without_dtype, tensor_named_twice_in_one_header, metadata_not_strings, index_names_a_missing_shard,
    index_and_shard_disagree, shard_tensor_missing_from_index, tensor_in_two_shards, index_is_not_json,
    index_weight_map_not_a_mapping, index_points_outside_the_folder, zero_length_tensor, config_and_weights_disagree,
    vocab_and_embedding_disagree, pytorch_bin_only, no_config, config_without_architectures, config_not_json,
    architectures_not_a_list, config_is_a_directory, config_is_a_fifo, shard_is_a_directory, single_file_is_a_fifo,
    impossible_layout, model_folder_missing, model_path_is_a_file, json_into_a_missing_folder,
]  # fmt: skip


@pytest.fixture(scope="module")
def source() -> Path:
    return build_fixture("tiny:qwen3")


@pytest.fixture
def ckpt(source: Path, tmp_path: Path) -> Path:
    """A private, writable copy of tiny:qwen3 in a folder whose path has spaces."""
    dst = tmp_path / "models with spaces" / "qwen3 copy"
    shutil.copytree(source, dst)
    return dst


def run_verify(
    *args: str, tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m convcheck verify ARGS` with a private TMPDIR (tmp_path/tmp), so that leftovers show."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    full_env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "COLUMNS": "200", **(env or {})}
    cmd = [sys.executable, "-m", "convcheck", "verify", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT, check=False)


def assert_one_line(proc: subprocess.CompletedProcess[str], needle: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("convcheck: error: "), lines[0]
    assert needle in lines[0], lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) + len(RANK_CASES) >= 25


@pytest.mark.parametrize("damage", CASES, ids=[c.__name__ for c in CASES])
def test_bad_input_is_one_line_before_any_rank(damage: Callable[[Path], Case], ckpt: Path, tmp_path: Path) -> None:
    case = damage(ckpt)
    model = case.model or ckpt
    before = snapshot(ckpt.parent)
    if case.in_prepare:  # fails in api.prepare: no torchrun is ever started
        with pytest.raises(BadInput) as caught:
            api.prepare(str(model), case.layout, device="cpu")
        assert case.needle in str(caught.value)
    out = tmp_path / "reports"
    out.mkdir()
    report, junit = case.json_path or out / "report.json", out / "junit.xml"
    t0 = time.monotonic()
    proc = run_verify("--model", str(model), *case.args, "--json", str(report), "--junit", str(junit),
                      tmp_path=tmp_path)  # fmt: skip
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 2, proc.stderr
    assert_one_line(proc, case.needle)
    assert proc.stdout == ""
    assert not report.exists() and not junit.exists() and list(out.iterdir()) == []
    assert snapshot(ckpt.parent) == before
    assert list((tmp_path / "tmp").iterdir()) == []


def test_sentinel_bits_are_a_nan_no_checkpoint_nan_matches() -> None:
    """Coverage counts elements holding exactly the sentinel's bits: other NaNs, infinities and zeros don't count."""
    import torch

    from convcheck.compare.bits import int_view
    from convcheck.rank.model import _bits_view, sentinel_bits, sentinel_count

    others = {  # torch's NaN, a negative NaN, a signalling NaN with another payload, +-inf, -0.0
        torch.bfloat16: [0x7FC0, -0x3F, 0x7F81, 0x7F80, -0x80, -0x8000],
        torch.float16: [0x7E00, 0x7C01, 0x7C00, -0x8000],
        torch.float32: [0x7FC00000, 0x7F800001, 0x7F800000, -0x80000000],
        torch.float64: [0x7FF8000000000000, 0x7FF0000000000001, 0x7FF0000000000000],
    }
    for dtype, bits in others.items():
        tensor = torch.zeros(16, dtype=dtype)
        _bits_view(tensor).fill_(sentinel_bits(dtype))
        assert bool(tensor.isnan().all()), dtype
        assert sentinel_count(tensor) == 16
        ints = int_view(tensor)
        ints[: len(bits)] = torch.tensor(bits, dtype=ints.dtype)
        assert int(tensor[: len(bits)].isnan().sum()) >= 1  # some of them are NaNs too
        assert sentinel_count(tensor) == 16 - len(bits), dtype
        assert sentinel_count(tensor.reshape(4, 4).t()) == 16 - len(bits)  # any strides


# --- cases that launch ranks --------------------------------------------------------------------------------------


def nan_and_inf_weights(ckpt: Path) -> list[int]:
    """model.norm.weight gets NaNs with several payloads (both signs, quiet and signalling) and infinities."""
    last = tensors_of(ckpt / SHARD3)
    dtype, shape, raw = last["model.norm.weight"]
    planted = [0x7FC0, 0xFFC1, 0x7F81, 0x7FFF, 0x7F80, 0xFF80]
    data = bytearray(raw)
    for i, bits in enumerate(planted):
        data[2 * i : 2 * i + 2] = struct.pack("<H", bits)
    last["model.norm.weight"] = (dtype, shape, bytes(data))
    pack(ckpt / SHARD3, last)
    return planted


@pytest.mark.ranks
def test_nan_weights_in_a_symlinked_folder_with_spaces_pass(ckpt: Path, tmp_path: Path) -> None:
    """Two unusual inputs that must work, in one launch: NaN/Inf weights (their payloads round-trip bitwise, so
    roundtrip passes, and coverage must not take them for the import sentinel) reached through a symlink."""
    from convcheck.rank.model import SENTINEL_BITS

    planted = nan_and_inf_weights(ckpt)
    assert SENTINEL_BITS["bfloat16"] not in planted
    link = tmp_path / "a link with spaces"
    link.symlink_to(ckpt, target_is_directory=True)
    before = snapshot(ckpt)
    report = tmp_path / "report.json"
    proc = run_verify("--model", str(link), "--oracle", "coverage,roundtrip", "--json", str(report),
                      tmp_path=tmp_path, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    data = json.loads(report.read_text())
    assert data["verdict"] == "pass" and data["model"] == str(link)
    oracles = {o["name"]: o for o in data["oracles"]}
    assert oracles["coverage"]["findings"] == [] and oracles["coverage"]["verdict"] == "pass"
    assert oracles["roundtrip"]["findings"] == [] and oracles["roundtrip"]["checked"] == 25
    rows = {r["tensor"]: r["verdict"] for r in oracles["roundtrip"]["tensors"]}
    assert rows["model.norm.weight"] == "pass"
    assert snapshot(ckpt) == before
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.ranks
def test_two_runs_at_once_share_a_fresh_fixture_cache(tmp_path: Path) -> None:
    """Both build tiny:qwen3 into the same empty cache at the same time; both pass and one fixture is left."""
    cache = tmp_path / "fresh cache"
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "CONVCHECK_CACHE_DIR": str(cache), "TMPDIR": str(tmp_path / "tmp")}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "convcheck",
                "verify",
                "--model",
                "tiny:qwen3",
                "--oracle",
                "coverage",
                "--json",
                str(tmp_path / f"report{i}.json"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
    for i in range(2):
        assert json.loads((tmp_path / f"report{i}.json").read_text())["verdict"] == "pass"
    fixtures = sorted(p.name for p in (cache / "fixtures").iterdir())
    assert len(fixtures) == 1 and fixtures[0].startswith("qwen3-"), fixtures  # no staging folder left behind
    assert (cache / "fixtures" / fixtures[0] / ".complete").is_file()
    assert list((tmp_path / "tmp").glob("convcheck-*")) == []  # (torch may leave its own torchinductor_* there)


@pytest.mark.ranks
def test_a_rank_that_dies_mid_export_ends_the_run(ckpt: Path, tmp_path: Path) -> None:
    before = snapshot(ckpt)
    report = tmp_path / "report.json"
    proc = run_verify("--model", str(ckpt), "--tp", "2", "--oracle", "coverage", "--json", str(report),
                      "--hook", mutant("faults", "kill_last_rank_mid_export"), "--timeout", "120", tmp_path=tmp_path,
                      timeout=200)  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
    line = assert_one_line(proc, "rank 1 died")  # "without reporting an error" when rank 0 first lost its peer
    assert "log: " in line
    assert not report.exists()
    assert snapshot(ckpt) == before


@pytest.mark.ranks
def test_a_rank_that_hangs_mid_export_is_stopped(ckpt: Path, tmp_path: Path) -> None:
    """One rank (TP2 with a hung peer is tests/test_checkpoint.py's case) stops in the export: the timeout ends it."""
    report = tmp_path / "report.json"
    t0 = time.monotonic()
    proc = run_verify("--model", str(ckpt), "--oracle", "coverage", "--json", str(report),
                      "--hook", mutant("faults", "hang_last_rank_mid_export"), "--timeout", "15", tmp_path=tmp_path,
                      timeout=120)  # fmt: skip
    assert time.monotonic() - t0 < 75  # the timeout, the stop and the start-up of a busy machine; not the hour
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
    assert_one_line(proc, "did not finish within 15 s (a rank hung or died); stopped all ranks")
    assert not report.exists()


RANK_CASES = ["NaN/Inf weights", "a symlinked folder with spaces", "two runs at once", "a rank dying mid-run",
              "a rank hanging mid-run"]  # fmt: skip
"""The corpus entries of the tests above that launch ranks (the first test holds two)."""
