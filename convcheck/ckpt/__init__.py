"""Megatron distributed checkpoints (torch_dist): save and resume across layouts in a rank (the distckpt oracle's
phases), and the version-folder format (manifest, index, shards) that convcheck.workflows.version writes and checks."""

from convcheck.ckpt.folder import Structure, check_index, check_manifest
from convcheck.ckpt.manifest import FORMAT, VersionManifest, read_version_manifest
from convcheck.ckpt.shards import ShardWriter, parse_size
from convcheck.ckpt.store import RestoreReport, SaveReport, restore_checkpoint, save_checkpoint

__all__ = [
    "FORMAT",
    "RestoreReport",
    "SaveReport",
    "ShardWriter",
    "Structure",
    "VersionManifest",
    "check_index",
    "check_manifest",
    "parse_size",
    "read_version_manifest",
    "restore_checkpoint",
    "save_checkpoint",
]
