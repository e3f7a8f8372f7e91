"""Oracles: each answers one question about a conversion with a typed verdict.

An oracle is a collective function `run(ctx: RankContext) -> OracleVerdict | None`: every rank calls it,
rank 0 returns the verdict. This registry imports nothing heavy, so the CLI can list and validate names.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from convcheck.errors import BadInput


@dataclass(frozen=True, kw_only=True, slots=True)
class OracleInfo:
    name: str
    module: str
    proves: str
    does_not_prove: str


ORACLES: dict[str, OracleInfo] = {
    o.name: o
    for o in (
        OracleInfo(
            name="coverage",
            module="convcheck.oracles.coverage",
            proves=(
                "every Megatron parameter and persistent buffer has a bridge mapping whose HF tensors exist, "
                "every element was written by the import, and the export produces every source tensor exactly "
                "once with no extra names"
            ),
            does_not_prove="that any value landed in the right place (see roundtrip)",
        ),
        OracleInfo(
            name="roundtrip",
            module="convcheck.oracles.roundtrip",
            proves=(
                "HF -> sharded Megatron -> HF export is byte-identical to the source checkpoint, tensor by tensor "
                "(dtype, shape and raw bytes)"
            ),
            does_not_prove=(
                "that the Megatron shards are laid out as Megatron's forward expects: a bug made identically in "
                "import and export cancels out"
            ),
        ),
        OracleInfo(
            name="config",
            module="convcheck.oracles.config",
            proves=(
                "every field of the per-architecture table (shapes, heads/groups, rope, norm eps, qk-norm, "
                "activation, tied embeddings, biases, MoE routing) holds in the built model's TransformerConfig, "
                "no HF field outside the table differs from its class default, and the bridge's "
                "megatron_to_hf_config gives back the same values"
            ),
            does_not_prove=(
                "that Megatron computes what the HF code computes for equal settings (see logits); fields that "
                "equal their class default are not examined"
            ),
        ),
        OracleInfo(
            name="logits",
            module="convcheck.oracles.logits",
            proves=(
                "the HF model and the loaded, sharded Megatron model (real TP/EP/PP collectives, upcast to fp32) "
                "give the same logits within the reported tolerance and the same greedy tokens on fixed random tokens"
            ),
            does_not_prove=(
                "bitwise equality, nor behaviour on other inputs, longer sequences, bf16, KV caching, dropout or "
                "training"
            ),
        ),
        OracleInfo(
            name="differential",
            module="convcheck.oracles.differential",
            proves=(
                "per conversion task, the real megatron_to_hf (true collectives) equals, bitwise, the union over "
                "ranks of a comm-stub probe run of the same mapping: every element covered, ranks agree, no probe "
                "slot missing from the real output"
            ),
            does_not_prove=(
                "that the mapping's local math is right (a bug outside the collectives is in both sides; see "
                "roundtrip); mappings that compute values instead of moving them are reported, not proven"
            ),
        ),
        OracleInfo(
            name="elements",
            module="convcheck.oracles.elements",
            proves=(
                "with index-coded shards, every element of every source HF tensor is written exactly once across "
                "ranks (replicas count once); gaps and overlaps are named as HF index ranges"
            ),
            does_not_prove="that the element written at an index holds the right value (see roundtrip, differential)",
        ),
        OracleInfo(
            name="layout",
            module="convcheck.oracles.layout_invariance",
            proves=(
                "the export at the requested layout is byte-identical, tensor by tensor, to a TP1 export of the "
                "same checkpoint (digest manifest from a separate 1-rank job) and to the source"
            ),
            does_not_prove="that a bug present identically at every layout (including TP1) is absent (see roundtrip)",
        ),
        OracleInfo(
            name="mapping",
            module="convcheck.oracles.mapping",
            proves=(
                "every parameter convcheck's explicit mappings cover holds, on every rank, exactly the shard those "
                "mappings derive from the HF checkpoint, and the bridge's export equals the HF tensors the mappings "
                "rebuild from the loaded shards (bitwise); catches bugs made identically in import and export"
            ),
            does_not_prove=(
                "anything about parameters the explicit registry does not cover (listed as uncovered), nor that "
                "the explicit mappings themselves match Megatron's forward beyond their own tests"
            ),
        ),
    )
}


def parse_oracle_names(spec: str | None) -> tuple[str, ...]:
    """Split `a,b` into known oracle names (all when empty); BadInput names an unknown one."""
    if not spec:
        return tuple(ORACLES)
    names = tuple(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    unknown = [n for n in names if n not in ORACLES]
    if unknown or not names:
        wrong = ", ".join(unknown) if unknown else repr(spec)
        raise BadInput(f"unknown oracle {wrong}; known: {', '.join(ORACLES)}")
    return names


def load_oracle(name: str) -> Callable[[Any], Any]:
    """The `run` function of oracle `name`."""
    return importlib.import_module(ORACLES[name].module).run
