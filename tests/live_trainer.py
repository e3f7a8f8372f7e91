"""Stands for a user's trainer under torchrun: its own process groups and AutoBridge model, weights perturbed as a
training step would, then convcheck.live inside the job. tests/test_live.py launches it and reads OUT/result.json.

usage: torchrun --standalone --nproc-per-node N tests/live_trainer.py CHECKPOINT TP EP PP ORACLES OUT [SENDER]
(LIVE_VPP=V: V virtual pipeline chunks per stage; LIVE_PP_SPLIT=F,L: F and L decoder layers on the first and last
stage)

The chunks are DistributedDataParallel(Float16Module(GPTModel)) as megatron training wraps them; with PP > 1 every
call also passes the job's ProcessGroupCollection.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

DEVICE = os.environ.get("LIVE_DEVICE", "cpu")
"""Where the trainer holds its model: cpu (gloo, the suite) or cuda (NCCL, one GPU per rank: docs/gpu.md)."""
VPP = int(os.environ.get("LIVE_VPP", "1"))
"""Model chunks per pipeline stage (a virtual pipeline when > 1: megatron-core interleaves the layers over them)."""
SPLIT = tuple(int(n) for n in os.environ.get("LIVE_PP_SPLIT", "").split(",") if n)
"""Decoder layers of the first and last pipeline stage (LIVE_PP_SPLIT=1,3: an uneven split; empty: even)."""


def setup(checkpoint: str, tp: int, ep: int, pp: int) -> tuple[list, object]:
    """The trainer's own bring-up: gloo groups (NCCL, one GPU per rank, with LIVE_DEVICE=cuda), parallel_state, the
    bridge's provider and the loaded model, wrapped in megatron-core's DistributedDataParallel as training wraps it."""
    from convcheck import compat  # this CPU machine's stand-in for Transformer Engine and CUDA, as in any CPU job

    device = DEVICE
    compat.install(device)
    from megatron.bridge import AutoBridge
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from convcheck.compat.no_cuda import cpu_current_device

    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=datetime.timedelta(seconds=300))
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1,
        virtual_pipeline_model_parallel_size=VPP if VPP > 1 else None,
    )
    if device == "cuda":
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    bridge = AutoBridge.from_hf_pretrained(checkpoint)
    provider = bridge.to_megatron_provider(load_weights=False)
    provider.tensor_model_parallel_size, provider.expert_model_parallel_size = tp, ep
    provider.pipeline_model_parallel_size, provider.expert_tensor_parallel_size = pp, 1
    provider.virtual_pipeline_model_parallel_size = VPP if VPP > 1 else None
    if SPLIT:
        provider.num_layers_in_first_pipeline_stage, provider.num_layers_in_last_pipeline_stage = SPLIT
    provider.sequence_parallel = False
    compat.configure_provider(provider, device)
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=device == "cpu")
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True)
    place = cpu_current_device() if device == "cpu" else contextlib.nullcontext()
    with place:  # as megatron's _ddp_wrap does it, minus its CUDA stream; on the CPU the grad buffers stay there
        model = [DistributedDataParallel(config=c.config, ddp_config=ddp, module=c, disable_bucketing=i > 0,
                                         pg_collection=c.pg_collection) for i, c in enumerate(model)]  # fmt: skip
    bridge.load_hf_weights(model)
    return model, bridge


def perturb(model: list, seed: int = 7) -> None:
    """A seeded add like an optimizer step: replicated parameters change identically on every rank that holds them,
    tensor-parallel shards and experts each by their own draw; the word embeddings and the last stage's tied output
    layer (`shared_embedding`, PP > 1) alike, as the embedding group's all-reduced gradient keeps them."""
    from megatron.core import parallel_state as ps

    with torch.no_grad():
        for chunk in model:
            for name, param in chunk.named_parameters():
                expert = getattr(param, "allreduce", True) is False
                shard = ps.get_expert_tensor_parallel_rank() if expert else ps.get_tensor_model_parallel_rank()
                own = (ps.get_expert_model_parallel_rank() if expert else 0, ps.get_pipeline_model_parallel_rank())
                key = f"{name}|{shard if getattr(param, 'tensor_model_parallel', False) else -1}|{own}"
                if getattr(param, "shared_embedding", False):  # one draw for both copies of a tied embedding
                    key = f"shared-embedding|{shard}"
                gen = torch.Generator().manual_seed(seed + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16))
                step = torch.randn(param.shape, generator=gen, dtype=torch.float32) * 1e-2
                param.add_(step.to(device=param.device, dtype=param.dtype))


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


def raises_on_rank1(ctx):  # type: ignore[no-untyped-def]
    """A user's sender (given as the function) streaming the bridge's export; on rank 1 only it raises after three
    tensors, while rank 0 keeps streaming."""
    for count, item in enumerate(ctx.bridge_export()):
        if count == 3 and ctx.rank == 1:
            raise ConnectionError("weight channel to the rollout closed")
        yield item


def one_rank_failures(model: list, bridge: object, groups: dict) -> dict:
    """Raises on some ranks only, each in a live call that every rank makes: a sender raising on rank 1 (rank 0's
    report), the coverage oracle raising in rank 0's own report, and (with a collection) a collection whose TP group
    disagrees with parallel_state. What each rank got, gathered on rank 0."""
    import convcheck.live
    from convcheck.errors import BadInput
    from convcheck.oracles import coverage
    from tests.live_trainer import raises_on_rank1  # the function under its module's name, not __main__

    report = convcheck.live.check(model, bridge, sender=raises_on_rank1, **groups)
    original, mine = coverage.exactly_once, {}

    def planted(parts: list) -> list:
        raise RuntimeError("planted: rank 0's report raised")

    coverage.exactly_once = planted  # rank 0 alone calls it, after coverage's gather
    try:
        convcheck.live.check(model, bridge, **groups)
    except convcheck.live.LiveFailure as exc:
        mine["oracle"] = str(exc)
    finally:
        coverage.exactly_once = original
    if groups:  # a collection whose TP group spans every rank: parallel_state's does not
        from megatron.core.process_groups_config import ProcessGroupCollection

        wrong = ProcessGroupCollection.use_mpu_process_groups()
        wrong.tp = dist.new_group(list(range(dist.get_world_size())))
        try:
            convcheck.live.check(model, bridge, pg_collection=wrong)
        except BadInput as exc:
            mine["refused"] = str(exc)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {
        "sender": report.to_dict() if report is not None else None,
        "oracle": [m.get("oracle") for m in every],
        "refused": [m.get("refused") for m in every],
    }


def cyclic_leftovers(model: list, bridge: object, groups: dict) -> int:
    """Objects of convcheck's or of the bridge's conversion code that a clean check leaves only Python's cyclic
    collector could free (each one a cycle the check's end would otherwise pay to walk)."""
    import gc

    import convcheck.live

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        convcheck.live.check(model, bridge, **groups)
        gc.collect()
        ours = ("convcheck", "megatron.bridge.models.conversion")
        return sum(1 for o in gc.garbage if type(o).__module__.startswith(ours))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def swap_experts_gate_up() -> None:
    """Layer 1's experts' export names their gate rows up_proj and their up rows gate_proj, after the EP gather (the
    probe makes the same swap, so only the explicit mapping sees it: the byte ranges the differential proved equal
    must not stand in for the mapping tap's compare of other ranges)."""
    from megatron.bridge.models.conversion.param_mapping import GatedMLPMapping

    from convcheck.mutants.patch import wrap

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, weights, module):  # type: ignore[no-untyped-def]
            out = original(self, weights, module)
            if not self.is_expert or ".layers.1." not in self.megatron_param:
                return out
            swapped = dict(out)
            for gate in (n for n in out if ".gate_proj." in n):
                up = gate.replace(".gate_proj.", ".up_proj.")
                swapped[gate], swapped[up] = out[up], out[gate]
            return swapped

        return megatron_to_hf

    wrap(GatedMLPMapping, "megatron_to_hf", make)


def wrappers(chunk: torch.nn.Module) -> str:
    """The chunk's classes from the outside in, down to the Megatron model (`A(B(C))`)."""
    names = [type(chunk).__name__]
    while isinstance(getattr(chunk, "module", None), torch.nn.Module):
        chunk = chunk.module
        names.append(type(chunk).__name__)
    return "(".join(names) + ")" * (len(names) - 1)


def main() -> int:
    checkpoint, tp, ep, pp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    oracles, out, sender = sys.argv[5], Path(sys.argv[6]), sys.argv[7] if len(sys.argv) > 7 else None
    import convcheck.live
    from convcheck.mutants.bridge import swap_qk_head0
    from convcheck.mutants.sync import TransposeOnReloadReceiver, flip_bit

    model, bridge = setup(checkpoint, tp, ep, pp)
    groups = {}
    if pp > 1:  # the job's own collection, as megatron training builds it for its model and DDP
        from megatron.core.process_groups_config import ProcessGroupCollection

        groups = {"pg_collection": ProcessGroupCollection.use_mpu_process_groups()}
    perturb(model)
    rank = dist.get_rank()
    before, patches = weights_digest(model), patched_state()
    clean = convcheck.live.check(model, bridge, oracles=oracles, sender=sender, **groups)
    after_clean = weights_digest(model)
    unpatched = patched_state() == patches and interrupted_check(model, bridge)
    sync_planted = None
    if sender:  # a sync path with two planted bugs, given as objects: a sender that flips one bit, a receiver that
        sync_planted = convcheck.live.check(  # transposes on reload
            model, bridge, oracles="receiver,idempotence", sender=flip_bit, receiver=TransposeOnReloadReceiver
        )
    manifest = convcheck.live.digest(model, bridge, out=out / "live.digest.json" if rank == 0 else None, **groups)
    if importlib.util.find_spec("modelopt") is not None:  # save_hf_weights imports it (absent on the GPU image)
        bridge.save_hf_weights(model, str(out / "export"))  # the receiver side's folder, for `convcheck sweep`
    failures = one_rank_failures(model, bridge, groups)
    leftovers = cyclic_leftovers(model, bridge, groups)
    swap_qk_head0()  # a mapping bug in the sync path (the bridge's export of layer 0's q/k), planted now
    planted = convcheck.live.check(model, bridge, oracles="coverage,differential,mapping", **groups)
    after_planted = weights_digest(model)
    experts_planted = None
    if ep > 1:  # and a bug in an EP-gathered expert's export, on top
        swap_experts_gate_up()
        experts_planted = convcheck.live.check(model, bridge, oracles="coverage,differential,mapping", **groups)
    misnumbered = None
    if VPP > 1 or SPLIT:  # the bridge numbering layers as if chunk 0's offset held for every chunk (VPP) or as if
        # the stages were even (an uneven split), planted after the checks above
        from convcheck.mutants.vpp import chunk_offset_from_chunk0, uneven_offset_as_even

        (uneven_offset_as_even if SPLIT else chunk_offset_from_chunk0)()
        misnumbered = convcheck.live.check(model, bridge, oracles="coverage", **groups)
    sameness = [before == after_clean, before == after_planted]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (sameness, unpatched, wrappers(model[0]), leftovers))
    if rank == 0:
        result = {
            "clean": clean.to_dict(),
            "planted": planted.to_dict(),
            "experts_planted": experts_planted.to_dict() if experts_planted is not None else None,
            "misnumbered": misnumbered.to_dict() if misnumbered is not None else None,
            "sync_planted": sync_planted.to_dict() if sync_planted is not None else None,
            "one_rank": failures,
            "weights_unchanged": [all(s[i] for s, _, _, _ in gathered) for i in range(2)],
            "nothing_left_patched": all(u for _, u, _, _ in gathered),
            "wrapped_as": sorted({w for _, _, w, _ in gathered}),
            "cyclic_leftovers": [g[3] for g in gathered],
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
