"""Megatron distributed checkpoints (torch_dist): save and resume across layouts in a rank (the distckpt oracle's
phases), and the version-folder format (manifest, index, shards) that convcheck.workflows.version writes and checks."""
