"""Gate manifests recorded on an older real release pair (convcheck/gate/releases/bridge-0.5.1: megatron-bridge 0.5.1,
megatron-core 0.18.2, transformers 5.8.1) against the current pins, through the golden manifests (which
tests/test_verify_matrix.py holds equal to what the current pins produce): every difference is one the allow file
explains, and the allow file has no entry that explains nothing. No ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from convcheck.gate import GOLDEN_DIR
from convcheck.gate.allow import AllowEntry, load_allow, triage
from convcheck.gate.check import Difference, compare
from convcheck.gate.manifest import load_manifest
from convcheck.workflows.gate_runner import read_index

RELEASE_DIR = GOLDEN_DIR.parent / "releases" / "bridge-0.5.1"
ALLOW = RELEASE_DIR / "allow-0.6.2.toml"
PAIR = {"megatron-bridge": "0.5.1", "megatron-core": "0.18.2", "transformers": "5.8.1"}


def differences() -> list[Difference]:
    """Every difference between the 0.5.1 manifests and the current pins' golden ones, case by case."""
    out = []
    for case in read_index(RELEASE_DIR).values():
        out += compare(load_manifest(RELEASE_DIR / case.file_name), load_manifest(GOLDEN_DIR / case.file_name))
    return out


def _shown(diffs: tuple[Difference, ...] | list[Difference]) -> str:
    return "\n".join(f"{d.case} {d.subject}: [{d.kind}] {d.message}" for d in diffs)


def test_release_manifests_were_recorded_on_that_pair() -> None:
    cases = read_index(RELEASE_DIR)
    assert sorted(cases) == ["qwen3-moe/ep2", "qwen3/tp1", "qwen3/tp2+pad128"]
    for case in cases.values():
        versions = load_manifest(RELEASE_DIR / case.file_name)["run"]["versions"]
        assert {k: versions[k] for k in PAIR} == PAIR, case.id


def test_current_pins_differ_from_0_5_1_only_as_the_allow_file_explains() -> None:
    diffs = differences()
    result = triage(diffs, load_allow(ALLOW), [c for c in read_index(RELEASE_DIR)])
    assert result.failing == (), _shown(result.failing)
    assert result.unused == (), [e.label for e in result.unused]
    assert sorted((d.case, d.kind, d.subject) for d in diffs) == [
        ("qwen3-moe/ep2", "config-changed", "norm_topk_prob"),
        ("qwen3-moe/ep2", "verdict-improved", "config"),
    ]


def test_the_0_5_1_config_finding_names_norm_topk_prob() -> None:
    """What the config oracle said on 0.5.1: the exported norm_topk_prob lost the source's True."""
    config = load_manifest(RELEASE_DIR / "qwen3-moe__ep2.json")["oracles"]["config"]
    assert config["verdict"] == "fail"
    assert [(f["tensor"], f["kind"]) for f in config["findings"]] == [
        ("norm_topk_prob (megatron_to_hf_config)", "roundtrip-mismatch")
    ]


@pytest.mark.parametrize("dropped", ["norm_topk_prob", "config"])
def test_an_unexplained_difference_fails(dropped: str) -> None:
    """Without its allow entry, the real 0.5.1 -> 0.6.2 difference is failing and named."""
    entries: list[AllowEntry] = [e for e in load_allow(ALLOW) if e.subject != dropped]
    result = triage(differences(), entries, list(read_index(RELEASE_DIR)))
    assert [d.subject for d in result.failing] == [dropped]


def test_allow_file_is_packaged_with_the_manifests() -> None:
    assert Path(ALLOW).is_file() and (RELEASE_DIR / "index.json").is_file()
