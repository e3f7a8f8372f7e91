"""Which device a run uses: the decision for `--device auto|cpu|cuda` and the count of visible GPUs."""

from __future__ import annotations

from convcheck.errors import BadInput

CHOICES = ("auto", "cpu", "cuda")


def choose_device(requested: str, visible_gpus: int, world_size: int) -> tuple[str, str]:
    """(device, reason) for `--device requested`, one rank per GPU on CUDA: auto gives "cuda" when every rank gets
    its own GPU, else "cpu"; cpu gives "cpu"; cuda gives "cuda", or BadInput with too few GPUs."""
    if requested not in CHOICES:
        raise BadInput(f"--device must be one of {', '.join(CHOICES)}, got {requested!r}")
    if visible_gpus < 0 or world_size < 1:
        raise ValueError(f"need visible_gpus >= 0 and world_size >= 1, got {visible_gpus} and {world_size}")
    enough = visible_gpus >= world_size
    if requested == "cpu":
        return "cpu", "--device cpu"
    if requested == "cuda":
        if not enough:
            raise BadInput(f"--device cuda needs {world_size} GPU(s) for this layout, found {visible_gpus}")
        return "cuda", f"--device cuda: {visible_gpus} GPU(s) visible for {world_size} rank(s)"
    if enough:
        return "cuda", f"--device auto: {visible_gpus} GPU(s) visible for {world_size} rank(s)"
    return "cpu", f"--device auto: {visible_gpus} GPU(s) visible, {world_size} rank(s) need one each"


def visible_gpu_count() -> int:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES respected), counted without creating a CUDA context."""
    import glob
    import os

    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1") or not glob.glob("/dev/nvidia[0-9]*") + glob.glob(
        "/dev/kfd"
    ):
        return 0  # no GPU device node (NVIDIA or ROCm): torch would count none; spare the CLI its import
    import subprocess
    import sys

    code = "import torch\ntry:\n    print(torch.cuda.device_count())\nexcept RuntimeError:\n    print(0)"
    try:  # in a child: the launcher side never imports torch
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return int(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):  # a broken driver counts as no GPU
        return 0
