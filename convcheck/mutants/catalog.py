"""The mutant catalog `convcheck selftest` runs: each planted bug as plain data (hook, fixture, layout, catchers).

Adding a mutant: write its hook in a convcheck.mutants module (or anywhere importable), then add a `Mutant(...)`
to MUTANTS. `catches` lists the oracles that must catch it; `targets` are fnmatch patterns for every finding name
it can cause (HF tensors, Megatron parameters, config labels; `logits` for a bug that changes the forward), so
that mutants sharing a launch get their own findings.
"""

from __future__ import annotations

from dataclasses import dataclass

FORWARD = "logits"
"""The target for a bug that changes the loaded model's forward (the logits oracle names no tensor)."""

_M = "convcheck.mutants."


@dataclass(frozen=True, kw_only=True, slots=True)
class Mutant:
    """One planted bug and where and by what it must be caught."""

    name: str
    description: str
    hook: str
    """`module:function` run in every rank before the model is built."""
    fixture: str
    """A built-in fixture, `tiny:<name>`."""
    layout: str
    """The layout `--quick` runs it at, spelled like "tp2ep2"."""
    catches: tuple[str, ...]
    """Oracles that must catch it (a miss there means the gate got weaker)."""
    targets: tuple[str, ...]
    """fnmatch patterns of every finding name it can cause; `logits` when it changes the forward."""
    more_layouts: tuple[str, ...] = ()
    """Further layouts a full (not --quick) selftest also runs it at."""
    experts: str = "sequential"
    """MoE expert layout (`--experts`)."""

    @property
    def layouts(self) -> tuple[str, ...]:
        return (self.layout, *self.more_layouts)


def _qk(layer: int) -> tuple[str, ...]:
    return (f"*.layers.{layer}.self_attn.[qk]_proj.weight", f"decoder.layers.{layer}.self_attention.linear_qkv.weight")


def _rule(hf: str, megatron: str) -> tuple[str, ...]:
    """The config oracle's finding names for one table rule: the rule and its megatron_to_hf_config roundtrip."""
    return (f"{hf} -> {megatron}", f"{hf} (megatron_to_hf_config)")


_QWEN3, _QWEN2, _LLAMA, _MOE, _NEMOTRON = "tiny:qwen3", "tiny:qwen2", "tiny:llama", "tiny:qwen3-moe", "tiny:nemotron-h"

MUTANTS: tuple[Mutant, ...] = (
    # --- attention: heads and query groups -------------------------------------------------------------------
    Mutant(
        name="swap_qk_head0",
        description="q/k head swap: QKV export trades layer 0's first q head with its first k head",
        hook=_M + "bridge:swap_qk_head0",
        fixture=_LLAMA,
        layout="tp1",
        more_layouts=("tp2",),
        catches=("roundtrip", "mapping"),
        targets=_qk(0),
    ),
    Mutant(
        name="gqa_qk_swap_group1",
        description="q/k swap in one query group: group 1's first q head and its k head trade places (layer 0)",
        hook=_M + "collectives:gqa_qk_swap_group1",
        fixture=_QWEN3,
        layout="tp2",
        catches=("roundtrip", "mapping"),
        targets=_qk(0),
    ),
    Mutant(
        name="qkv_groups_reversed",
        description="GQA group order: QKV export emits layer 1's query groups in reverse order",
        hook=_M + "collectives:qkv_groups_reversed",
        fixture=_LLAMA,
        layout="tp1",
        catches=("roundtrip", "mapping"),
        targets=("*.layers.1.self_attn.[qkv]_proj.weight", "decoder.layers.1.self_attention.linear_qkv.weight"),
    ),
    Mutant(
        name="qk_order_swapped",
        description="symmetric QKV: import and export both lay each group out as [k, q.., v] (roundtrip-invisible)",
        hook=_M + "symmetric:qk_order_swapped",
        fixture=_MOE,
        layout="tp2ep2",
        catches=("mapping", "logits"),
        targets=("*.self_attn.[qkv]_proj.weight", "*.linear_qkv.weight", FORWARD),
    ),
    Mutant(
        name="qkv_not_interleaved",
        description="symmetric QKV: merge/split use [all q; all k; all v] instead of per-group blocks",
        hook=_M + "symmetric:qkv_not_interleaved",
        fixture=_QWEN2,
        layout="tp2",
        more_layouts=("tp1",),
        catches=("mapping", "logits"),
        targets=("*.self_attn.[qkv]_proj.weight", "*.linear_qkv.weight", FORWARD),
    ),
    # --- tensor-parallel shards and row/column layouts --------------------------------------------------------
    Mutant(
        name="tp_concat_reversed",
        description="TP shard order: the TP gather returns the word-embedding shards in reverse rank order",
        hook=_M + "collectives:tp_concat_reversed",
        fixture=_QWEN3,
        layout="tp2",
        catches=("roundtrip", "differential", "layout"),
        targets=("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
    ),
    Mutant(
        name="gate_up_swapped",
        description="gate/up swap: gated-MLP export names layer 1's gate rows up_proj and its up rows gate_proj",
        hook=_M + "bridge:gate_up_swapped",
        fixture=_QWEN3,
        layout="tp1",
        more_layouts=("tp2",),
        catches=("roundtrip", "mapping"),
        targets=(
            "*.layers.1.mlp.gate_proj.weight",
            "*.layers.1.mlp.up_proj.weight",
            "*.layers.1.mlp.linear_fc1.weight",
        ),
    ),
    Mutant(
        name="gate_up_swapped_under_tp",
        description="gate/up swap only under TP: rank 1's gate and up halves trade places (layer 0)",
        hook=_M + "collectives:gate_up_swapped_under_tp",
        fixture=_QWEN3,
        layout="tp2",
        catches=("roundtrip", "mapping", "layout"),
        targets=(
            "*.layers.0.mlp.gate_proj.weight",
            "*.layers.0.mlp.up_proj.weight",
            "*.layers.0.mlp.linear_fc1.weight",
        ),
    ),
    Mutant(
        name="transpose_o_proj",
        description="transposed row-parallel weight: layer 0's o_proj exported transposed (square: only bytes show)",
        hook=_M + "bridge:transpose_o_proj",
        fixture=_LLAMA,
        layout="tp1",
        more_layouts=("tp2",),
        catches=("roundtrip", "mapping"),
        targets=("*.layers.0.self_attn.o_proj.weight", "decoder.layers.0.self_attention.linear_proj.weight"),
    ),
    # --- vocab and output layer --------------------------------------------------------------------------------
    Mutant(
        name="drop_vocab_rows",
        description="vocab rows dropped: lm_head export loses its last 8 rows (padding removed with the wrong size)",
        hook=_M + "collectives:drop_vocab_rows",
        fixture=_QWEN3,
        layout="tp2",
        catches=("roundtrip", "elements", "mapping"),
        targets=("lm_head.weight", "output_layer.weight"),
    ),
    Mutant(
        name="vocab_padding_leaked",
        description="vocab padding leaked: the provider pads the vocab for TP and the export keeps the padding rows",
        hook=_M + "bridge:vocab_padding_leaked",
        fixture=_QWEN2,
        layout="tp2",
        catches=("roundtrip", "elements", "layout", "mapping"),
        targets=(
            "lm_head.weight",
            "model.embed_tokens.weight",
            "output_layer.weight",
            "embedding.word_embeddings.weight",
            FORWARD,
        ),
    ),
    Mutant(
        name="tied_embedding_not_emitted",
        description="tied lm_head not emitted: at PP>1 the export drops the tied word embeddings as a duplicate",
        hook=_M + "bridge:tied_embedding_not_emitted",
        fixture="tiny:qwen2-tied",
        layout="pp2",
        catches=("coverage", "roundtrip", "layout", "mapping"),
        targets=("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
    ),
    Mutant(
        name="pp_layer_off_by_one",
        description="PP layer renumbering: local-to-global layer ids are one short after the first stage",
        hook=_M + "bridge:pp_layer_off_by_one",
        fixture="tiny:qwen2-tied",
        layout="pp2",
        catches=("coverage", "roundtrip", "elements", "layout", "logits"),
        targets=("*.layers.*", FORWARD),
    ),
    # --- names and dtypes in the export stream ----------------------------------------------------------------
    Mutant(
        name="duplicate_name",
        description="duplicated HF name: the export emits model.norm.weight twice",
        hook=_M + "bridge:duplicate_name",
        fixture=_QWEN2,
        layout="tp2",
        catches=("coverage",),
        targets=("model.norm.weight", "decoder.final_layernorm.weight"),
    ),
    Mutant(
        name="drop_hf_name",
        description="dropped HF name: the export never emits model.layers.1.input_layernorm.weight",
        hook=_M + "bridge:drop_hf_name",
        fixture=_QWEN3,
        layout="tp1",
        catches=("coverage", "roundtrip", "mapping"),
        targets=("*.layers.1.input_layernorm.weight",),
    ),
    Mutant(
        name="dtype_change",
        description="dtype upcast: the export casts layer 0's post-attention norm to float32",
        hook=_M + "bridge:dtype_change",
        fixture=_QWEN3,
        layout="tp1",
        catches=("roundtrip", "mapping"),
        targets=("*.layers.0.post_attention_layernorm.weight", "*.layers.0.pre_mlp_layernorm.weight"),
    ),
    Mutant(
        name="downcast_router_bias",
        description="dtype downcast of an fp32 tensor: the export casts NemotronH's router expert bias to bf16",
        hook=_M + "bridge:downcast_router_bias",
        fixture=_NEMOTRON,
        layout="tp1",
        catches=("roundtrip", "mapping"),
        targets=("*.e_score_correction_bias", "*.router.expert_bias"),
    ),
    Mutant(
        name="export_nonpersistent_buffer",
        description="non-persistent buffer exported: the router's local_tokens_per_expert counter is written",
        hook=_M + "bridge:export_nonpersistent_buffer",
        fixture=_NEMOTRON,
        layout="tp1",
        catches=("coverage", "roundtrip"),
        targets=("*local_tokens_per_expert",),
    ),
    # --- values -------------------------------------------------------------------------------------------------
    Mutant(
        name="flip_one_bit",
        description="one flipped bit: the import flips the low bit of one element of layer 1's down_proj",
        hook=_M + "bridge:flip_one_bit",
        fixture=_QWEN2,
        layout="tp2",
        catches=("roundtrip", "mapping"),
        targets=("*.layers.1.mlp.down_proj.weight", "*.layers.1.mlp.linear_fc2.weight", FORWARD),
    ),
    Mutant(
        name="drop_qkv_bias",
        description="bias dropped: the export of layer 0's fused qkv bias returns nothing",
        hook=_M + "bridge:drop_qkv_bias",
        fixture=_QWEN2,
        layout="tp2",
        catches=("coverage", "roundtrip", "elements", "mapping"),
        targets=("*.layers.0.self_attn.[qkv]_proj.bias", "*.layers.0.self_attention.linear_qkv.bias"),
    ),
    Mutant(
        name="norm_zero_centered",
        description="zero-centred norm +1 offset: layer 1's MLP norm goes through gamma-1 / +1 though it is not",
        hook=_M + "bridge:norm_zero_centered",
        fixture=_QWEN2,
        layout="tp2",
        catches=("roundtrip", "mapping", "logits"),
        targets=("*.layers.1.post_attention_layernorm.weight", "*.layers.1.pre_mlp_layernorm.weight", FORWARD),
    ),
    Mutant(
        name="skip_load_final_norm",
        description="parameter left at init: the import of the final norm writes nothing",
        hook=_M + "bridge:skip_load_final_norm",
        fixture=_MOE,
        layout="tp2ep2",
        catches=("coverage", "roundtrip", "mapping"),
        targets=("decoder.final_layernorm.weight", "model.norm.weight", FORWARD),
    ),
    Mutant(
        name="scale_o_proj_on_import",
        description="weight scaled on import: layer 0's o_proj is loaded times 1.5 (config untouched)",
        hook=_M + "config:scale_o_proj_on_import",
        fixture=_QWEN3,
        layout="tp2",
        catches=("roundtrip", "mapping", "logits"),
        targets=("*.layers.0.self_attn.o_proj.weight", "*.layers.0.self_attention.linear_proj.weight", FORWARD),
    ),
    # --- experts --------------------------------------------------------------------------------------------------
    Mutant(
        name="ep_local_ids",
        description="expert local-vs-global id: the EP gather names layer 1's experts by their local id",
        hook=_M + "collectives:ep_local_ids",
        fixture=_MOE,
        layout="tp2ep2",
        more_layouts=("ep2",),
        catches=("coverage", "roundtrip", "differential"),
        targets=("*.layers.1.mlp.experts.*",),
    ),
    Mutant(
        name="grouped_export_local_expert_id",
        description="expert local-vs-global id, TEGroupedMLP: grouped weightE export names experts by local id",
        hook=_M + "te_grouped:grouped_export_local_expert_id",
        fixture=_MOE,
        layout="ep2",
        experts="te-grouped",
        catches=("coverage", "roundtrip", "differential", "mapping"),
        targets=("*.layers.*.mlp.experts.*",),
    ),
    Mutant(
        name="expert_left_at_init",
        description="expert left at init: the import of layer 0's expert 5 gate|up writes nothing",
        hook=_M + "bridge:expert_left_at_init",
        fixture=_MOE,
        layout="tp2ep2",
        more_layouts=("ep2",),
        catches=("coverage", "roundtrip", "mapping", "logits"),
        targets=(
            "*.layers.0.mlp.experts.5.gate_proj.weight",
            "*.layers.0.mlp.experts.5.up_proj.weight",
            "*.layers.0.mlp.experts.local_experts.5.linear_fc1.weight",
            FORWARD,
        ),
    ),
    Mutant(
        name="drop_expert3",
        description="expert dropped: the export skips every tensor of layer 1's expert 3",
        hook=_M + "bridge:drop_expert3",
        fixture=_MOE,
        layout="tp2ep2",
        more_layouts=("ep2",),
        catches=("coverage", "roundtrip"),
        targets=("*.layers.1.mlp.experts.3.*", "*.layers.1.mlp.experts.local_experts.3.*"),
    ),
    Mutant(
        name="ep_gather_stale_off_rank0",
        description="EP gather result discarded off rank 0: the other ranks export their own expert under every "
        "global id of layer 0's up/gate projections (rank 0's export is right)",
        hook=_M + "collectives:ep_gather_stale_off_rank0",
        fixture=_MOE,
        layout="tp2ep2",
        more_layouts=("ep2",),
        catches=("differential",),
        targets=("*.layers.0.mlp.experts.*.gate_proj.weight", "*.layers.0.mlp.experts.*.up_proj.weight"),
    ),
    Mutant(
        name="ep_not_gathered",
        description="EP gather missing: layer 0's expert down projections are exported from the own EP rank only",
        hook=_M + "collectives:ep_not_gathered",
        fixture=_MOE,
        layout="tp2ep2",
        more_layouts=("ep2",),
        catches=("coverage", "roundtrip", "differential", "mapping"),
        targets=(
            "*.layers.0.mlp.experts.*.down_proj.weight",
            "*.layers.0.mlp.experts.local_experts.*.linear_fc2.weight",
        ),
    ),
    Mutant(
        name="etp_not_gathered",
        description="ETP gather missing: each rank exports only its own expert-tensor-parallel shard",
        hook=_M + "collectives:etp_not_gathered",
        fixture=_MOE,
        layout="tp2etp2",
        catches=("roundtrip", "differential", "layout"),
        targets=("*.layers.*.mlp.experts.*",),
    ),
    Mutant(
        name="etp_halves_swapped",
        description="ETP halves swapped: the expert-TP gather returns layer 1's expert shards in reverse order",
        hook=_M + "collectives:etp_halves_swapped",
        fixture=_MOE,
        layout="tp2etp2",
        catches=("roundtrip", "differential", "layout", "mapping"),
        targets=("*.layers.1.mlp.experts.*",),
    ),
    Mutant(
        name="unmap_router",
        description="unmapped parameter: the mapping registry forgets layer 0's router (upstream only warns)",
        hook=_M + "bridge:unmap_router",
        fixture=_MOE,
        layout="tp2ep2",
        more_layouts=("ep2",),
        catches=("coverage",),
        targets=("*",),  # the export stream then fails on the unmapped task: it runs alone
    ),
    # --- config the bridge hands to Megatron-Core ------------------------------------------------------------------
    Mutant(
        name="wrong_rope_theta",
        description="rope theta: the provider's rotary_base is doubled",
        hook=_M + "config:wrong_rope_theta",
        fixture=_QWEN3,
        layout="tp1",
        catches=("config", "logits"),
        targets=(*_rule("rope_parameters.rope_theta", "rotary_base"), FORWARD),
    ),
    Mutant(
        name="eps_off",
        description="RMSNorm eps: the provider's layernorm_epsilon is 1e-2 instead of 1e-6",
        hook=_M + "config:eps_off",
        fixture=_QWEN3,
        layout="tp1",
        catches=("config", "logits"),
        targets=(*_rule("rms_norm_eps", "layernorm_epsilon"), FORWARD),
    ),
    Mutant(
        name="drop_qk_norm",
        description="qk-norm dropped: Qwen3's q/k RMSNorm is missing from the Megatron attention",
        hook=_M + "config:drop_qk_norm",
        fixture=_QWEN3,
        layout="tp1",
        catches=("config", "logits"),
        targets=(
            "<implied> -> qk_layernorm",
            "*.self_attn.[qk]_norm.weight",
            "*.self_attention.[qk]_layernorm.weight",
            FORWARD,
        ),
    ),
    Mutant(
        name="flip_tied",
        description="tied flag inverted: share_embeddings_and_output_weights is the opposite of HF's",
        hook=_M + "config:flip_tied",
        fixture=_QWEN3,
        layout="tp1",
        catches=("config", "logits"),
        targets=(
            *_rule("tie_word_embeddings", "share_embeddings_and_output_weights"),
            "lm_head.weight",
            "output_layer.weight",
            FORWARD,
        ),
    ),
    Mutant(
        name="router_topk",
        description="router top-k: the router picks 3 experts per token instead of HF's 2",
        hook=_M + "config:router_topk",
        fixture=_MOE,
        layout="tp2ep2",
        catches=("config", "logits"),
        targets=(*_rule("num_experts_per_tok", "moe_router_topk"), FORWARD),
    ),
    # --- Mamba (NemotronH) ------------------------------------------------------------------------------------------
    Mutant(
        name="dt_before_bc",
        description="Mamba in_proj dt-before-B/C: each rank's in_proj rows are [z, x, dt, B, C] (import and export)",
        hook=_M + "mamba:dt_before_bc",
        fixture=_NEMOTRON,
        layout="tp1",
        more_layouts=("tp2",),
        catches=("mapping", "logits"),
        targets=("*.mixer.in_proj.weight", FORWARD),
    ),
    Mutant(
        name="conv1d_bc_swapped",
        description="Mamba conv1d channel order: conv1d holds [x, C, B] per rank (import and export)",
        hook=_M + "mamba:conv1d_bc_swapped",
        fixture=_NEMOTRON,
        layout="tp1",
        more_layouts=("tp2",),
        catches=("mapping", "logits"),
        targets=("*.mixer.conv1d[._]weight", "*.mixer.conv1d[._]bias", FORWARD),
    ),
    Mutant(
        name="a_log_sign_flipped",
        description="Mamba A_log sign: A_log is stored negated and negated back on export",
        hook=_M + "mamba:a_log_sign_flipped",
        fixture=_NEMOTRON,
        layout="tp1",
        catches=("mapping", "logits"),
        targets=("*.mixer.A_log", FORWARD),
    ),
    Mutant(
        name="halve_mamba_heads",
        description="Mamba heads: the provider gets half of HF's mamba_num_heads (every Mamba shape changes)",
        hook=_M + "hybrid:halve_mamba_heads",
        fixture=_NEMOTRON,
        layout="tp1",
        catches=("config", "logits"),
        targets=("*",),
    ),
    Mutant(
        name="swap_pattern",
        description="hybrid pattern: the provider swaps the attention and MLP layers (M*-ME -> M-*ME)",
        hook=_M + "hybrid:swap_pattern",
        fixture=_NEMOTRON,
        layout="tp1",
        catches=("config", "logits"),
        targets=("*",),
    ),
    Mutant(
        name="gated_norm_eps",
        description="Mamba gated-norm eps: every MambaMixer's gated RMSNorm gets eps 1e-2",
        hook=_M + "hybrid:gated_norm_eps",
        fixture=_NEMOTRON,
        layout="tp1",
        catches=("config", "logits"),
        targets=(*_rule("layer_norm_epsilon", "model.decoder.layers.*.mixer.norm.eps"), FORWARD),
    ),
)
"""Every shipped mutant, in the order the kill matrix lists them."""
