"""Bad inputs: each is one clear line on stderr and exit code 2, with no traceback and nothing written."""

import json
import shutil
import struct
from pathlib import Path

import pytest

from convcheck.errors import BadInput
from convcheck.fixtures.build import build_fixture
from convcheck.hf.checkpoint import open_checkpoint
from tests.support.helpers import mutant, run_cli


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A private, writable copy of tiny:qwen3."""
    dst = tmp_path / "qwen3"
    shutil.copytree(build_fixture("tiny:qwen3"), dst)
    return dst


def _first_shard(folder: Path) -> Path:
    return sorted(folder.glob("*.safetensors"))[0]


def corrupt_header(folder: Path) -> str:
    shard = _first_shard(folder)
    data = bytearray(shard.read_bytes())
    data[8:16] = b"\x00garbage"
    shard.write_bytes(bytes(data))
    return "header is not valid JSON"


def huge_header_length(folder: Path) -> str:
    shard = _first_shard(folder)
    data = bytearray(shard.read_bytes())
    data[:8] = struct.pack("<Q", 1 << 40)
    shard.write_bytes(bytes(data))
    return "header length"


def truncated_shard(folder: Path) -> str:
    shard = _first_shard(folder)
    shard.write_bytes(shard.read_bytes()[:-100])
    return "truncated safetensors file"


def missing_shard(folder: Path) -> str:
    _first_shard(folder).unlink()
    return "missing shard"


def index_names_wrong_shard(folder: Path) -> str:
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    name = next(iter(data["weight_map"]))
    data["weight_map"][name] = next(
        f for f in sorted(set(data["weight_map"].values())) if f != data["weight_map"][name]
    )
    index.write_text(json.dumps(data))
    return "does not hold it"


def no_config(folder: Path) -> str:
    (folder / "config.json").unlink()
    return "no config.json"


@pytest.mark.parametrize(
    "damage", [corrupt_header, huge_header_length, truncated_shard, missing_shard, index_names_wrong_shard, no_config]
)
def test_damaged_checkpoint_is_bad_input(ckpt: Path, tmp_path: Path, damage) -> None:  # type: ignore[no-untyped-def]
    needle = damage(ckpt)
    with pytest.raises(BadInput, match=needle):
        open_checkpoint(ckpt)
    report = tmp_path / "existing.json"
    report.write_text("keep me")
    res = run_cli("verify", "--model", str(ckpt), "--json", str(report))
    assert res.code == 2
    assert needle in res.err
    assert len(res.err.strip().splitlines()) == 1, res.err
    assert "Traceback" not in res.err + res.out
    assert report.read_text() == "keep me"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--model", "/nonexistent/model"), "model directory not found"),
        (("--model", "tiny:nope"), "unknown fixture"),
        (("--model", "tiny:qwen3", "--tp", "3"), "impossible layout TP3"),
        (("--model", "tiny:qwen3", "--ep", "2"), "has no experts"),
        (("--model", "tiny:qwen3-moe", "--ep", "3"), "does not divide num_experts"),
        (("--model", "tiny:qwen3", "--oracle", "nope"), "unknown oracle nope"),
        (("--model", "tiny:qwen3", "--hook", "no-colon"), "MODULE:FUNCTION"),
    ],
)
def test_bad_arguments(args: tuple[str, ...], needle: str) -> None:
    res = run_cli("verify", *args)
    assert res.code == 2, res.err
    assert needle in res.err
    assert len(res.err.strip().splitlines()) == 1, res.err


@pytest.mark.ranks
def test_unknown_architecture(ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    config["architectures"] = ["FooBarForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(config))
    res = run_cli("verify", "--model", str(ckpt), "--timeout", "120")
    assert res.code == 2
    assert "FooBarForCausalLM" in res.err
    assert len(res.err.strip().splitlines()) == 1, res.err


@pytest.mark.ranks
def test_dead_rank_ends_the_run() -> None:
    res = run_cli(
        "verify", "--model", "tiny:qwen3", "--tp", "2", "--hook", mutant("faults", "kill_rank1"), "--timeout", "120"
    )
    assert res.code == 2
    assert "rank 1 died" in res.err
    assert len(res.err.strip().splitlines()) == 1, res.err


@pytest.mark.ranks
def test_hung_rank_is_stopped_within_the_timeout() -> None:
    import time

    t0 = time.monotonic()
    res = run_cli(
        "verify", "--model", "tiny:qwen3", "--tp", "2", "--hook", mutant("faults", "hang_rank1"), "--timeout", "25"
    )
    assert res.code == 2
    assert "did not finish within 25 s" in res.err
    assert time.monotonic() - t0 < 60
