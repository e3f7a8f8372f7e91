"""Oracle descriptions: coverage, roundtrip, config, logits, differential, elements, layout_invariance, mapping."""

from __future__ import annotations

from convcheck.oracles.base import OracleInfo

COVERAGE = OracleInfo(
    name="coverage",
    module="convcheck.oracles.coverage",
    proves="every Megatron parameter and persistent buffer has a bridge mapping whose HF tensors exist, "
    "every element was written by the import, every global parameter is held exactly once per "
    "model-parallel replica (no two EP ranks or PP stages claim one name), and the export produces every "
    "source tensor exactly once with no extra names; under a virtual pipeline or uneven stages, every model chunk "
    "holds exactly the decoder layers the layout puts there",
    does_not_prove="that any value landed in the right place (see roundtrip)",
    drains_export=True,
    live="every Megatron parameter and persistent buffer of the job's chunks has a bridge mapping whose HF tensors "
    "the bridge's own checkpoint header names, every global parameter is held exactly once per model-parallel "
    "replica, and the export of the trained weights produces every tensor that header names exactly once with no "
    "extra names (names, shapes and dtypes from the header only; that an import wrote every element is the job's own "
    "load, not checked live)",
)

ROUNDTRIP = OracleInfo(
    name="roundtrip",
    module="convcheck.oracles.roundtrip",
    proves="HF -> sharded Megatron -> HF export is byte-identical to the source checkpoint, tensor by tensor "
    "(dtype, shape and raw bytes)",
    does_not_prove="that the Megatron shards are laid out as Megatron's forward expects: a bug made identically in "
    "import and export cancels out",
    drains_export=True,
    reads_source=True,
)

CONFIG = OracleInfo(
    name="config",
    module="convcheck.oracles.config",
    proves="every field of the per-architecture table (shapes, heads/groups, rope, norm eps, qk-norm, "
    "activation, tied embeddings, biases, MoE routing) holds in the built model's TransformerConfig, "
    "no HF field outside the table differs from its class default, and the bridge's "
    "megatron_to_hf_config gives back the same values",
    does_not_prove="that Megatron computes what the HF code computes for equal settings (see logits); fields that "
    "equal their class default are not examined",
)

LOGITS = OracleInfo(
    name="logits",
    module="convcheck.oracles.logits",
    proves="the HF model and the loaded, sharded Megatron model (real TP/EP/PP collectives, upcast to fp32) "
    "give the same logits within the reported tolerance and the same greedy tokens on fixed random tokens",
    does_not_prove="bitwise equality, nor behaviour on other inputs, longer sequences, bf16, KV caching, dropout or "
    "training, nor the MTP head (transformers has no MTP module; MTP weights are checked bitwise only)",
)

DIFFERENTIAL = OracleInfo(
    name="differential",
    module="convcheck.oracles.differential",
    proves="per conversion task, the real megatron_to_hf (true collectives) equals, bitwise, the union over "
    "ranks of a comm-stub probe run of the same mapping: every element covered, ranks agree, no probe "
    "slot missing from the real output (tasks of one rank and shard geometry whose mappings differ only in their layer "
    "and expert numbers share one probe run, its slots renamed, once a probed task moved in each number agrees; every "
    "task's real output is still compared bitwise with its own shard)",
    does_not_prove="that the mapping's local math is right (a bug outside the collectives is in both sides; see "
    "roundtrip); mappings that compute values instead of moving them are reported, not proven (except the "
    "elementwise value maps convcheck.probe.values declares, checked bitwise against the declared map); that replicas "
    "of a tensor no collective touches hold equal weights (see mapping)",
    rides_on="export",
    live="the same on the trained weights, over the job's own process groups: per conversion task the real "
    "megatron_to_hf equals, bitwise, the union over ranks of the comm-stub probe (index codes on copies, the weights "
    "never written); every element covered, ranks agree",
)

ELEMENTS = OracleInfo(
    name="elements",
    module="convcheck.oracles.elements",
    proves="with index-coded shards, every element of every source HF tensor is written exactly once across "
    "ranks (replicas count once); gaps and overlaps are named as HF index ranges",
    does_not_prove="that the element written at an index holds the right value (see roundtrip, differential)",
    live="the same with index codes on copies of the job's shards (the weights are never written): every element of "
    "every tensor the bridge's checkpoint header names is written exactly once across ranks",
)

LAYOUT_INVARIANCE = OracleInfo(
    name="layout",
    module="convcheck.oracles.layout_invariance",
    proves="the export at the requested layout is byte-identical, tensor by tensor, to the source; every tensor "
    "that is not is attributed by a TP1 export (a separate 1-rank job, launched only then): layout-dependent, or "
    "wrong the same way at TP1",
    does_not_prove="that a TP1 export of tensors that equal the source at this layout would equal them too "
    "(a TP1 run's own roundtrip proves that)",
    drains_export=True,  # where roundtrip has not answered for it
)

MAPPING = OracleInfo(
    name="mapping",
    module="convcheck.oracles.mapping",
    proves="every parameter convcheck's explicit mappings cover holds, on every rank, exactly the shard those "
    "mappings derive from the HF checkpoint, and the bridge's export equals the HF tensors the mappings "
    "rebuild from the loaded shards (bitwise: the source tensor where every shard matched, else rebuilt from the "
    "gathered shards); catches bugs made identically in import and export",
    does_not_prove="anything about parameters the explicit registry does not cover (listed as uncovered), nor that "
    "the explicit mappings themselves match Megatron's forward beyond their own tests",
    drains_export=True,  # where roundtrip has not answered for it
    rides_on="source",
    live_rides_on="export",
    live="every rank's shard of every covered parameter is the explicit mappings' to_shard of the export of the "
    "trained weights, so the export is what they rebuild from the shards (a wrong shard's parameter is rebuilt on "
    "rank 0, the export's first wrong element named); the shards are not checked against a source (there is none)",
)
