"""No-CUDA shims follow the requested device, never torch.cuda.is_available() (issue #18): fresh processes on a
simulated GPU host (is_available() answers True; no GPU here, so reaching CUDA raises and the probe names it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.support.helpers import shared_value

NO_CUDA_PROBES = ("2 replicated-mapping", "4 rope", "4 memory-buffer", "5 causal-mask", "6 rng-fork")


def probe(devices: list[str], gpu_host: bool, plant_old_rule: bool) -> None:
    """Install for each of `devices` in turn; print, per install, where every no-CUDA shim sends its work."""
    import torch

    if gpu_host:
        torch.cuda.is_available = lambda: True  # what a GPU workstation answers
    from convcheck import compat
    from convcheck.compat import no_cuda

    if plant_old_rule:  # planted bug: the rule before issue #18, "route to CPU only when CUDA is unavailable"
        no_cuda.active = lambda: not torch.cuda.is_available()
    out = []
    for device in devices:
        compat.install(device)
        out.append({"device": device, "installed": _installed(), "probes": _where(), "eager": _compiled_run_eagerly()})
    print(json.dumps(out))


def _installed() -> list[str]:
    """The upstream attributes wrapped by a no-CUDA shim."""
    from megatron.bridge.models.conversion.param_mapping import ReplicatedMapping
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.ssm.mamba_mixer import MambaMixer
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
    from megatron.core.transformer import utils
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.utils import GlobalMemoryBuffer

    from convcheck.compat._patch import shims_on

    attributes = {
        "ReplicatedMapping.hf_to_megatron": ReplicatedMapping.hf_to_megatron,
        "LanguageModule.setup_embeddings_and_output_layer": LanguageModule.setup_embeddings_and_output_layer,
        "RotaryEmbedding.get_emb": RotaryEmbedding.get_emb,
        "GlobalMemoryBuffer.get_tensor": GlobalMemoryBuffer.get_tensor,
        "get_default_causal_mask": utils.get_default_causal_mask,
        "CudaRNGStatesTracker.fork": CudaRNGStatesTracker.fork,
        "TopKRouter.__init__": TopKRouter.__init__,
        "MambaMixer.__init__": MambaMixer.__init__,
    }
    return sorted(k for k, f in attributes.items() if any(".no_cuda." in s for s in shims_on(f)))


_PROBED: list[str] = []


def _compiled_run_eagerly() -> bool:
    """Whether a torch.compile'd function runs without compiling: its backend never called, dynamo never entered (on
    the simulated GPU host dynamo reaches for the missing CUDA driver and raises)."""
    import torch

    graphs = []

    def backend(gm: Any, _inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    source = f"lambda x: x * 2 + {len(_PROBED)}"  # a code object of its own: dynamo remembers one that failed
    _PROBED.append(source)
    try:
        torch.compile(eval(compile(source, f"<probe {len(_PROBED)}>", "eval")), backend=backend)(torch.ones(2))
    except Exception:  # noqa: BLE001 - dynamo ran (and failed on the simulated host): not eager
        return False
    return not graphs


def _where() -> dict[str, str]:
    """Device type each probe's result lands on, or the exception it raised trying to reach CUDA."""
    import torch
    from megatron.bridge.models.conversion.param_mapping import ReplicatedMapping
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
    from megatron.core.transformer import utils
    from megatron.core.utils import GlobalMemoryBuffer

    class Tp2Rank1(ReplicatedMapping):  # the real method; only the process group is replaced
        tp_size, tp_rank = 2, 1

        def broadcast_tensor_to_tp_ranks(self, tensor: Any, src_rank: int = 0) -> Any:
            return tensor

    def rng_fork() -> str:
        with CudaRNGStatesTracker().fork():
            return torch.empty(1).device.type

    rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, rotary_base=10000, use_cpu_initialization=True)
    probes = {
        "2 replicated-mapping": lambda: (
            Tp2Rank1("a.weight", "b.weight").hf_to_megatron(torch.ones(2), torch.nn.Linear(2, 2)).device.type
        ),
        "4 rope": lambda: rope.get_emb(4).device.type,
        "4 memory-buffer": lambda: GlobalMemoryBuffer().get_tensor((2,), torch.float32, "x").device.type,
        "5 causal-mask": lambda: utils.get_default_causal_mask(3).device.type,
        "6 rng-fork": rng_fork,
    }
    out = {}
    for name, run in probes.items():
        try:
            out[name] = run()
        except Exception as exc:  # noqa: BLE001 - upstream reaching for CUDA (megatron raises plain Exception too)
            out[name] = type(exc).__name__
    return out


def _run(devices: list[str], gpu_host: bool = True, plant_old_rule: bool = False, **env: str) -> list[dict]:
    code = f"from tests.test_compat_device import probe; probe({devices!r}, {gpu_host}, {plant_old_rule})"
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, **env})  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


ALL_NO_CUDA = sorted(
    [
        "CudaRNGStatesTracker.fork",
        "GlobalMemoryBuffer.get_tensor",
        "LanguageModule.setup_embeddings_and_output_layer",
        "MambaMixer.__init__",
        "ReplicatedMapping.hf_to_megatron",
        "RotaryEmbedding.get_emb",
        "TopKRouter.__init__",
        "get_default_causal_mask",
    ]
)


@pytest.fixture
def switched(shared_root: Path) -> list[dict]:
    """One fresh process on a simulated GPU host installing for cuda, cpu, cuda, cpu in turn, once per session (what
    the two tests below read; one import of megatron for both)."""
    return shared_value(shared_root, "compat-device-switched", lambda: _run(["cuda", "cpu", "cuda", "cpu"]))


@pytest.mark.fresh_process
def test_cpu_run_on_a_gpu_host_routes_every_no_cuda_shim_to_the_cpu(switched: list[dict]) -> None:
    """The first CPU install, and again after a CUDA install deactivated the shims."""
    for cpu in (switched[1], switched[3]):
        assert cpu["installed"] == ALL_NO_CUDA
        assert cpu["probes"] == dict.fromkeys(NO_CUDA_PROBES, "cpu")
        assert cpu["eager"]  # upstream's torch.compile'd functions run eagerly on a CPU run (convcheck.compat.eager)


@pytest.mark.fresh_process
def test_hidden_gpus_change_nothing() -> None:
    """A CPU run's ranks get CUDA_VISIBLE_DEVICES="" (engine.launch.rank_env): the shims decide the same."""
    (cpu,) = _run(["cpu"], gpu_host=False, CUDA_VISIBLE_DEVICES="")
    assert cpu["installed"] == ALL_NO_CUDA
    assert cpu["probes"] == dict.fromkeys(NO_CUDA_PROBES, "cpu")


@pytest.mark.fresh_process
def test_planted_is_available_rule_is_named() -> None:
    """The pre-#18 rule (CPU only while CUDA is unavailable) lets every probe reach CUDA on a GPU host."""
    (cpu,) = _run(["cpu"], plant_old_rule=True)
    reached_cuda = sorted(name for name, where in cpu["probes"].items() if where != "cpu")
    assert reached_cuda == sorted(NO_CUDA_PROBES), cpu["probes"]


@pytest.mark.fresh_process
def test_cuda_run_installs_no_cpu_shim_and_deactivates_earlier_ones(switched: list[dict]) -> None:
    cuda, cpu, cuda_again, _ = switched
    assert cuda["installed"] == [] and cpu["installed"] == ALL_NO_CUDA == cuda_again["installed"]
    assert [cuda["eager"], cpu["eager"], cuda_again["eager"]] == [False, True, False]  # compile follows the device
    assert cpu["probes"] == dict.fromkeys(NO_CUDA_PROBES, "cpu")
    assert all(where != "cpu" for where in cuda_again["probes"].values()), cuda_again["probes"]
