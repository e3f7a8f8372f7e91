"""`python -m convcheck.rollout.packs_probe` in the engine's interpreter: prints `packs` when this CPU's vLLM backend
packs a dense bf16 weight away at load (the layer computes with a copy made then), `live` when it falls back to
torch's linear over the live parameter. Asks vLLM's own `dispatch_cpu_unquantized_gemm` on one [128, 64] layer."""

from __future__ import annotations

import torch
from vllm.model_executor.layers import utils

from convcheck.rollout.host import reads_its_weight


def main() -> None:
    layer = torch.nn.Module()
    weight = torch.arange(128 * 64, dtype=torch.float32).reshape(128, 64).div(8192).to(torch.bfloat16)
    layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    print("live" if reads_its_weight(layer, weight) else "packs")


if __name__ == "__main__":
    main()
