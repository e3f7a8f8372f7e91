"""Reshard: trainer Megatron shards -> rollout shards at another TP/EP, slice by slice, without a full gather.

roles.py (each parameter's role, from the bridge mapping class), target.py (the reference target shards, from the HF
tensors), plan.py (pieces: source rank and slice -> destination slice), execute.py (the pieces over torch.distributed).
"""

from __future__ import annotations

from convcheck.reshard.target import TargetLayout

__all__ = ["TargetLayout"]
