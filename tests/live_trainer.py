"""Stands for a user's trainer under torchrun: its own process groups and AutoBridge model, weights perturbed as a
training step would, then convcheck.live inside the job. tests/test_live.py launches it and reads OUT/result.json.

usage: torchrun --standalone --nproc-per-node N tests/live_trainer.py CHECKPOINT TP EP ORACLES OUT [SENDER]
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def setup(checkpoint: str, tp: int, ep: int) -> tuple[list, object]:
    """The trainer's own bring-up: gloo groups, parallel_state, the bridge's provider and the loaded model."""
    from convcheck import compat  # this CPU machine's stand-in for Transformer Engine and CUDA, as in any CPU job

    compat.install("cpu")
    from megatron.bridge import AutoBridge
    from megatron.core import parallel_state

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, expert_model_parallel_size=ep, expert_tensor_parallel_size=1
    )
    bridge = AutoBridge.from_hf_pretrained(checkpoint)
    provider = bridge.to_megatron_provider(load_weights=False)
    provider.tensor_model_parallel_size, provider.expert_model_parallel_size = tp, ep
    provider.expert_tensor_parallel_size = 1
    provider.sequence_parallel = False
    compat.configure_provider(provider, "cpu")
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    bridge.load_hf_weights(model)
    return model, bridge


def perturb(model: list, seed: int = 7) -> None:
    """A seeded add like an optimizer step: replicated parameters change identically on every rank that holds them,
    tensor-parallel shards and experts each by their own draw."""
    from megatron.core import parallel_state as ps

    with torch.no_grad():
        for chunk in model:
            for name, param in chunk.named_parameters():
                expert = getattr(param, "allreduce", True) is False
                shard = ps.get_expert_tensor_parallel_rank() if expert else ps.get_tensor_model_parallel_rank()
                own = (ps.get_expert_model_parallel_rank() if expert else 0, ps.get_pipeline_model_parallel_rank())
                key = f"{name}|{shard if getattr(param, 'tensor_model_parallel', False) else -1}|{own}"
                gen = torch.Generator().manual_seed(seed + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16))
                step = torch.randn(param.shape, generator=gen, dtype=torch.float32) * 1e-2
                param.add_(step.to(param.dtype))


def weights_digest(model: list) -> str:
    """sha256 over every parameter and buffer of this rank, bytes and names (what must not change)."""
    from convcheck.compare.bits import raw_bytes

    h = hashlib.sha256()
    for chunk in model:
        for name, tensor in list(chunk.named_parameters()) + list(chunk.named_buffers()):
            h.update(name.encode())
            h.update(raw_bytes(tensor))
    return h.hexdigest()


def patched_state() -> dict[str, int]:
    """Identities of what the oracles patch while they run (torch.distributed calls, the bridge's mapping methods)."""
    from megatron.bridge.models.conversion import param_mapping

    out = {f"dist.{n}": id(getattr(dist, n)) for n in dir(dist) if callable(getattr(dist, n, None))}
    for cls_name in dir(param_mapping):
        cls = getattr(param_mapping, cls_name)
        if isinstance(cls, type):
            out.update({f"{cls_name}.{k}": id(v) for k, v in vars(cls).items() if callable(v)})
    return out


class Wrapped(torch.nn.Module):
    """Holds a chunk as `.module`, the way DDP and Float16Module do."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


SYNC = "convcheck.mutants.sync"


class Interrupted(BaseException):
    """What a job's own signal handling might raise inside the check (not an Exception: nothing catches it)."""


def interrupted_sender(ctx):  # type: ignore[no-untyped-def]
    """The bridge's export, interrupted on every rank after three tensors."""
    for count, item in enumerate(ctx.bridge_export()):
        if count == 3:
            raise Interrupted("stop")
        yield item


def interrupted_check(model: list, bridge: object) -> bool:
    """live.check raising out of coverage's drain (the differential's probe riding on it): True when it raised and
    left nothing patched behind."""
    import convcheck.live

    patches = patched_state()
    try:
        convcheck.live.check(model, bridge, sender="tests.live_trainer:interrupted_sender")
    except BaseException as exc:  # noqa: BLE001 - the module is imported twice (as __main__ and by its spec)
        return type(exc).__name__ == "Interrupted" and patched_state() == patches
    return False


def main() -> int:
    checkpoint, tp, ep, oracles, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
    sender = sys.argv[6] if len(sys.argv) > 6 else None
    import convcheck.live
    from convcheck.mutants.bridge import swap_qk_head0

    model, bridge = setup(checkpoint, tp, ep)
    perturb(model)
    rank = dist.get_rank()
    before, patches = weights_digest(model), patched_state()
    clean = convcheck.live.check(model, bridge, oracles=oracles, sender=sender)
    after_clean = weights_digest(model)
    unpatched = patched_state() == patches and interrupted_check(model, bridge)
    sync_planted = None
    if sender:  # a sync path with two planted bugs: a sender that flips one bit, a receiver that transposes on reload
        sync_planted = convcheck.live.check(
            model,
            bridge,
            oracles="receiver,idempotence",
            sender=f"{SYNC}:flip_bit",
            receiver=f"{SYNC}:TransposeOnReloadReceiver",
        )
    manifest = convcheck.live.digest(model, bridge, out=out / "live.digest.json" if rank == 0 else None)
    bridge.save_hf_weights(model, str(out / "export"))  # the receiver side's folder, for `convcheck sweep`
    swap_qk_head0()  # a mapping bug in the sync path (the bridge's export of layer 0's q/k), planted now
    wrapped = [Wrapped(chunk) for chunk in model]  # as DDP / Float16Module hold it: the check unwraps `.module`
    planted = convcheck.live.check(wrapped, bridge, oracles="coverage,differential,mapping")
    after_planted = weights_digest(model)
    sameness = [before == after_clean, before == after_planted]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (sameness, unpatched))
    if rank == 0:
        result = {
            "clean": clean.to_dict(),
            "planted": planted.to_dict(),
            "sync_planted": sync_planted.to_dict() if sync_planted is not None else None,
            "weights_unchanged": [all(s[i] for s, _ in gathered) for i in range(2)],
            "nothing_left_patched": all(u for _, u in gathered),
            "digest_tensors": len(manifest.tensors),
        }
        (out / "result.json").write_text(json.dumps(result, indent=1))
    dist.barrier()
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
