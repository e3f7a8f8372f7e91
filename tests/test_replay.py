"""The replay line a failing verify prints is built from its Job, and parsing it back gives the same Job."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from convcheck import api
from convcheck.cli.main import PREPARE_OPTIONS, job_from_options, replay_line, verify
from convcheck.layout import ParallelLayout

HOOK = "convcheck.mutants.bridge:transpose_o_proj"


def _parse(line: str):  # -> the Job `convcheck verify ARGS` of the replay line prepares
    words = shlex.split(line)
    assert words[:2] == ["convcheck", "verify"]
    params = verify.make_context("verify", words[2:]).params
    return job_from_options({k: params[k] for k in PREPARE_OPTIONS})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"layout": "tp2ep2", "oracles": "roundtrip,mapping", "hooks": (HOOK,)},
        {"layout": "ep2", "oracles": "roundtrip,receiver,idempotence", "sender": "bucketed", "receiver": "fused",
         "chunk_mb": 0.05, "device": "cpu"},
        {"layout": "tp2", "oracles": "distckpt,reshard", "resume_layout": ("tp1", "ep2"), "target_tp": (1, 2),
         "target_ep": (1, 2), "pad_vocab": 128},
        {"layout": ParallelLayout(ep=2), "oracles": "coverage,roundtrip", "experts": "te-grouped"},
        {"layout": "tp2", "oracles": "roundtrip,save", "options": {"save_dtype": "fp16"}},
    ],
)  # fmt: skip
def test_the_replay_line_parses_back_to_the_same_job(kwargs: dict) -> None:
    layout = kwargs.pop("layout")
    job = api.prepare("tiny:qwen3-moe", layout, **kwargs)
    again = _parse(replay_line(job, job.oracles))
    assert again == job


def test_the_replay_line_keeps_only_the_failing_oracles_and_the_requested_device() -> None:
    job = api.prepare("tiny:qwen3-moe", "tp2", oracles="roundtrip,distckpt", resume_layout="ep2", device="cpu")
    line = replay_line(job, ["roundtrip"])
    assert line == "convcheck verify --model tiny:qwen3-moe --tp 2 --device cpu --oracle roundtrip"
    assert _parse(line) == replace(job, oracles=("roundtrip",), resume_layouts=())
