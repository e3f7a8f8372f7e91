"""Megatron distributed checkpoints (torch_dist): save and resume across layouts (the distckpt oracle), and version
folders (a checkpoint and its HF safetensors export side by side, written and checked)."""

from convcheck.ckpt.folder import Structure, check_index, check_manifest
from convcheck.ckpt.manifest import FORMAT, VersionManifest, read_version_manifest
from convcheck.ckpt.shards import ShardWriter, parse_size
from convcheck.ckpt.store import RestoreReport, SaveReport, restore_checkpoint, save_checkpoint
from convcheck.ckpt.version import WriteResult, check_version, write_version

__all__ = [
    "FORMAT",
    "RestoreReport",
    "SaveReport",
    "ShardWriter",
    "Structure",
    "VersionManifest",
    "WriteResult",
    "check_index",
    "check_manifest",
    "check_version",
    "parse_size",
    "read_version_manifest",
    "restore_checkpoint",
    "save_checkpoint",
    "write_version",
]
