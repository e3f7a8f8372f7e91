"""Megatron distributed checkpoints (torch_dist): save and resume across layouts, and version folders."""
