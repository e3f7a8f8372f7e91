"""convcheck.device: the --device auto|cpu|cuda decision table, the visible GPU count, and the ranks' environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from convcheck.device import choose_device
from convcheck.engine.launch import rank_env
from convcheck.errors import BadInput


@pytest.mark.parametrize(
    ("requested", "gpus", "world", "device"),
    [
        ("auto", 0, 1, "cpu"),
        ("auto", 0, 2, "cpu"),
        ("auto", 1, 1, "cuda"),
        ("auto", 1, 2, "cpu"),
        ("auto", 2, 2, "cuda"),
        ("auto", 3, 4, "cpu"),
        ("auto", 8, 4, "cuda"),
        ("cpu", 0, 1, "cpu"),
        ("cpu", 8, 2, "cpu"),
        ("cpu", 8, 8, "cpu"),
        ("cuda", 1, 1, "cuda"),
        ("cuda", 2, 2, "cuda"),
        ("cuda", 8, 4, "cuda"),
    ],
)
def test_decision_table(requested: str, gpus: int, world: int, device: str) -> None:
    chosen, reason = choose_device(requested, gpus, world)
    assert chosen == device
    assert reason.startswith(f"--device {requested}") and "\n" not in reason


@pytest.mark.parametrize(("gpus", "world"), [(0, 1), (1, 2), (3, 4), (0, 8)])
def test_cuda_with_too_few_gpus_is_bad_input_with_todays_message(gpus: int, world: int) -> None:
    with pytest.raises(BadInput) as err:
        choose_device("cuda", gpus, world)
    assert str(err.value) == f"--device cuda needs {world} GPU(s) for this layout, found {gpus}"


def test_unknown_device_is_bad_input() -> None:
    with pytest.raises(BadInput, match="--device must be one of auto, cpu, cuda, got 'gpu'"):
        choose_device("gpu", 1, 1)


@pytest.mark.parametrize(("gpus", "world"), [(-1, 1), (0, 0)])
def test_impossible_counts_raise(gpus: int, world: int) -> None:
    with pytest.raises(ValueError, match="visible_gpus >= 0 and world_size >= 1"):
        choose_device("auto", gpus, world)


def test_visible_gpu_count_with_gpus_hidden() -> None:
    """CUDA_VISIBLE_DEVICES="" (a CPU run's ranks) counts 0 GPUs and creates no CUDA context."""
    code = "import torch; from convcheck.device import visible_gpu_count as v; print(v(), torch.cuda.is_initialized())"
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["0", "False"]


def test_cpu_ranks_see_no_gpu_cuda_ranks_keep_theirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    assert rank_env("cpu")["CUDA_VISIBLE_DEVICES"] == ""
    assert rank_env("cuda")["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert rank_env("cuda")["NCCL_NVLS_ENABLE"] == "0" and "NCCL_NVLS_ENABLE" not in rank_env("cpu")
