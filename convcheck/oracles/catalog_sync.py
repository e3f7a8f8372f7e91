"""Oracle descriptions: receiver, idempotence, delta, broadcast, engine."""

from __future__ import annotations

from pathlib import Path

from convcheck.hooks import parse_hook
from convcheck.oracles.base import OracleInfo, OracleOption
from convcheck.rollout.environment import check_python


def _receiver_spec(spec: str) -> str:
    """`reload` or MODULE:FUNC / FILE.py:FUNC (a file made absolute: the engine process imports it, from the repo)."""
    if spec == "reload":
        return spec
    parsed = parse_hook(spec, what="--engine-receiver")
    return f"{Path(parsed.target).resolve()}:{parsed.function}" if parsed.is_file else spec


RECEIVER = OracleInfo(
    name="receiver",
    module="convcheck.oracles.receiver",
    proves="after one full sync through the chosen sender (--sender) into the receiver (--receiver, default hf), "
    "built on rank 0 and filled with a NaN sentinel, every receiver parameter is bitwise what the source "
    "checkpoint implies (the receiver's expected(), default: the HF tensor of the same name), nothing is left "
    "unwritten, and every source tensor is delivered exactly once",
    does_not_prove="that the receiver computes correctly with those parameters, or anything about partial syncs; "
    "it trusts the receiver's expected() (the fused receiver's packs by torch.cat, its loader by row offsets)",
    default=False,
    live="the same against the bridge's own export of the trained weights instead of a source: after one full sync "
    "through the chosen sender into the NaN-filled receiver (rank 0, built from the bridge's config.json), every "
    "receiver parameter is bitwise what that export implies (its expected()), nothing is left unwritten, and every "
    "exported tensor is delivered exactly once (with the default sender this proves the receiver's loading; with "
    "yours, also that it streams what the bridge exports); it costs a second export drain",
)

IDEMPOTENCE = OracleInfo(
    name="idempotence",
    module="convcheck.oracles.idempotence",
    proves="after one full sync through the chosen sender into the receiver (rank 0), replaying the same tensors "
    "in the same, reversed and shuffled name order leaves every receiver parameter bit-identical to the snapshot "
    "taken after the first sync, and the receiver never modifies the tensors it is handed",
    does_not_prove="that the first sync was right (see receiver), or idempotence of partial or interleaved syncs",
    default=False,
    live="the same for the trained weights streamed by the chosen sender: replaying the sync in the same, reversed "
    "and shuffled order leaves the receiver (rank 0, built from the bridge's config.json) bit-identical",
)

DELTA = OracleInfo(
    name="delta",
    module="convcheck.oracles.delta",
    proves="previous export + the sparse delta (built in HF coordinates, encoded and decoded through the wire "
    "format) == the export after a planted in-place update of a few parameters, bitwise, tensor by tensor; the "
    "update shows in the delta; the delta of an unchanged export is empty and applying an empty delta is a no-op",
    does_not_prove="that a real optimizer step's changes are exported (the planted update flips low bits of a few "
    "elements), or anything about a receiver applying the delta (see receiver)",
    default=False,
)

BROADCAST = OracleInfo(
    name="broadcast",
    module="convcheck.oracles.broadcast",
    proves="every tensor of the sender's stream, broadcast by rank 0 over a process group of its own in chunks of "
    "at most --chunk-mb, arrives on every other rank complete and byte-identical to that rank's own read of the "
    "source checkpoint (dtype, shape, raw bytes); measures bytes, seconds and effective bandwidth",
    does_not_prove="anything about other transports (IPC handles, NCCL on other topologies) or a receiver "
    "loading the bytes (see receiver); needs at least 2 ranks",
    default=False,
)

ENGINE = OracleInfo(
    name="engine",
    module="convcheck.oracles.engine",
    proves="after the run's export (the chosen --sender, at this layout) is synced into a real vLLM engine (its own "
    "process and environment; tensors in shared-memory buckets of --chunk-mb; vLLM's reload_weights or "
    "--engine-receiver) that was first loaded from the source checkpoint by its own loader and then poisoned "
    "(every weight sign-flipped through its reload path, shown to reach every tensor and its outputs), every "
    "parameter and every weight the CPU backend packs (as last packed) is bitwise what the engine's fresh load held, "
    "the prompt logprobs and greedy tokens of fixed prompts are bitwise the fresh load's, every source tensor "
    "reaches the receiver exactly once, a second identical sync changes nothing, and (--engine-delta on) a planted "
    "update's delta leaves the engine computing bitwise what a fresh load of the updated checkpoint computes",
    does_not_prove="that the engine's fresh load is itself right (its loader and kernels are the reference), "
    "deltas other than the planted one, sampling with temperature, or other prompts; packed weights are read "
    "where the engine packs them, not inside the packed kernel format",
    default=False,
    options=(
        OracleOption(
            flag="--engine-python",
            metavar="PATH",
            check=check_python,
            help="the interpreter of the engine's environment (default: $CONVCHECK_ENGINE_PYTHON, else "
            ".venv-vllm/bin/python, built by `make env-vllm`).",
        ),
        OracleOption(
            flag="--engine-delta",
            choices=("off", "on"),
            default="off",
            help="after the full syncs proved right, also sync a planted update (3 tensors of the source with every "
            "odd element's sign flipped, written as an updated checkpoint) and prove the engine then computes "
            "bitwise what a second engine's fresh load of that checkpoint computes (default: off).",
        ),
        OracleOption(
            flag="--engine-transport",
            choices=("shm", "folder"),
            default="shm",
            help="how the synced tensors reach the engine: shm (shared-memory buckets of --chunk-mb, streamed) or "
            "folder (safetensors files of at most --chunk-mb each in a temporary folder, loaded by vLLM's "
            "reload_weights(weights_path=...) or handed to --engine-receiver; removed after each sync) (default: shm).",
        ),
        OracleOption(
            flag="--engine-receiver",
            metavar="FILE.py:FUNC",
            check=_receiver_spec,
            help="the engine-side receiver, called inside the engine process as FUNC(llm, weights) "
            "(default: reload, vLLM's worker reload_weights).",
        ),
    ),  # fmt: skip
    ready=lambda options: check_python(options.get("engine_python")),
    early="convcheck.oracles.engine:start_engine",
)
