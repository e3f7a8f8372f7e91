"""Planted checkpoint bugs: rank hooks (`--hook convcheck.mutants.checkpoint:NAME`) that patch the real megatron-core
restore, and edits of a written version folder that a broken trainer or sync job could leave behind.

Each must be named by the distckpt oracle or `convcheck version check` (tests/test_distckpt.py, tests/test_version.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedBase
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from safetensors.torch import load_file, save_file

from convcheck.compare.bits import int_view
from convcheck.mutants.patch import wrap

DROPPED_KEY = "decoder.final_layernorm.weight"


def drop_key_on_restore() -> None:
    """The restore asks for every sharded key but the final norm's: that parameter keeps its pre-load values."""

    def make(original: Any) -> Any:
        def load(sharded_state_dict, checkpoint_dir, *args, **kwargs):  # type: ignore[no-untyped-def]
            for part in sharded_state_dict.values():
                if isinstance(part, dict):
                    for name in [n for n, v in part.items() if isinstance(v, ShardedBase) and v.key == DROPPED_KEY]:
                        del part[name]
            return original(sharded_state_dict, checkpoint_dir, *args, **kwargs)

        return load

    wrap(dist_checkpointing, "load", make)


def moment_on_wrong_expert() -> None:
    """After the optimizer state is restored, the Adam moments of two same-shaped experts trade places."""

    def make(original: Any) -> Any:
        def load_state_dict(self, state_dict):  # type: ignore[no-untyped-def]
            out = original(self, state_dict)
            names = {p: n for chunk in self.model_chunks for n, p in chunk.named_parameters()}
            experts = [p for group in self.model_float16_groups for p in group if ".experts." in names.get(p, "")]
            states = [self._get_main_param_and_optimizer_states(p) for p in experts]
            for i, first in enumerate(states):
                other = next((s for s in states[i + 1 :] if s["exp_avg"].shape == first["exp_avg"].shape), None)
                if other is not None:
                    for key in ("exp_avg", "exp_avg_sq"):
                        saved = first[key].clone()
                        first[key].copy_(other[key])
                        other[key].copy_(saved)
                    break
            return out

        return load_state_dict

    wrap(DistributedOptimizer, "load_state_dict", make)


def unindex_shard(folder: str | Path) -> str:
    """Remove the last shard's tensors from the index (the file stays): returns that shard's name."""
    index_file = Path(folder) / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if f != shard}
    index.get("metadata", {}).pop("total_size", None)
    index_file.write_text(json.dumps(index, indent=2))
    return shard


def corrupt_digest(folder: str | Path) -> str:
    """Change one hex digit of one tensor's digest in manifest.json: returns that tensor's name."""
    manifest_file = Path(folder) / "manifest.json"
    data = json.loads(manifest_file.read_text())
    name = sorted(data["tensors"])[0]
    digest = data["tensors"][name]["digest"]
    data["tensors"][name]["digest"] = ("1" if digest[0] == "0" else "0") + digest[1:]
    manifest_file.write_text(json.dumps(data, indent=2))
    return name


def export_from_other_step(folder: str | Path) -> list[str]:
    """Replace the export by one taken a step later (every element moved by one ulp), with an index and a manifest
    consistent with it (digests and step): only the checkpoint comparison can tell. Returns the changed tensors."""
    import hashlib

    root = Path(folder)
    manifest_file = root / "manifest.json"
    data = json.loads(manifest_file.read_text())
    changed = []
    for shard in sorted(root.glob("*.safetensors")):
        tensors = load_file(str(shard))
        for name, tensor in tensors.items():
            if tensor.is_floating_point():
                bits = int_view(tensor).clone()
                bits += 1
                tensors[name] = bits.view(tensor.dtype).reshape(tensor.shape)
                changed.append(name)
            raw = memoryview(int_view(tensors[name].contiguous()).numpy()).cast("B")
            data["tensors"][name]["digest"] = hashlib.sha256(raw).hexdigest()
        save_file(tensors, str(shard), metadata={"format": "pt"})
    data["step"] = (data.get("step") or 0) + 1
    manifest_file.write_text(json.dumps(data, indent=2))
    return sorted(changed)
