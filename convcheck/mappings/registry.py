"""Per-architecture registries: every Megatron parameter -> exactly one explicit mapping, checked both ways."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from convcheck.mappings.base import CoverageError, MappingError, TensorMapping
from convcheck.mappings.grouped_mlp import GroupedFc1, GroupedFc2
from convcheck.mappings.mamba import mamba_conv1d, mamba_in_proj
from convcheck.mappings.qkv import FusedQKV
from convcheck.mappings.simple import Gated, Replicated, Split


@dataclass(frozen=True, kw_only=True, slots=True)
class Geometry:
    """The shapes a mapping needs, read from an HF config."""

    hidden: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    vocab: int
    padded_vocab: int
    """Megatron's embedding rows (vocab, or vocab padded by the provider)."""
    num_experts: int = 0
    moe_ffn: int = 0
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_groups: int = 0
    mamba_state: int = 0

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], *, padded_vocab: int | None = None) -> "Geometry":
        """Geometry of a decoder-only HF config (nested text_config accepted)."""
        cfg = {**config, **(config.get("text_config") or {})}
        try:
            hidden, heads, vocab = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["vocab_size"])
        except (KeyError, TypeError, ValueError):
            raise MappingError("HF config lacks hidden_size, num_attention_heads or vocab_size") from None
        return cls(
            hidden=hidden,
            num_heads=heads,
            num_query_groups=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            vocab=vocab,
            padded_vocab=padded_vocab or vocab,
            num_experts=int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0),
            moe_ffn=int(cfg.get("moe_intermediate_size") or 0),
            mamba_heads=int(cfg.get("mamba_num_heads") or 0),
            mamba_head_dim=int(cfg.get("mamba_head_dim") or 0),
            mamba_groups=int(cfg.get("n_groups") or 0),
            mamba_state=int(cfg.get("ssm_state_size") or 0),
        )


Rule = tuple[str, Callable[[re.Match[str], Geometry], TensorMapping]]
_L = r"decoder\.layers\.(?P<layer>\d+)\."
_H = "model.layers.{layer}."


def _hf(m: re.Match[str], suffix: str) -> str:
    return _H.format(layer=m["layer"]) + suffix


def _expert_hf(m: re.Match[str], proj: str) -> str:
    return _hf(m, f"mlp.experts.{{expert}}.{proj}.weight")


def _rules(tied: bool) -> list[Rule]:
    """The Llama / Qwen2 / Qwen3 / Qwen3-MoE family (local spec, TE spec and legacy GroupedMLP names)."""
    embed = "model.embed_tokens.weight"
    rules: list[Rule] = [
        (r"embedding\.word_embeddings\.weight", lambda m, g: Split(
            megatron=m[0], hf=embed, padded_rows=g.padded_vocab, unpadded_rows=g.vocab)),
        (r"decoder\.final_layernorm\.weight", lambda m, g: Replicated(megatron=m[0], hf="model.norm.weight")),
        (_L + r"(input_layernorm\.weight|self_attention\.linear_qkv\.layer_norm_weight)",
         lambda m, g: Replicated(megatron=m[0], hf=_hf(m, "input_layernorm.weight"))),
        (_L + r"(pre_mlp_layernorm\.weight|mlp\.linear_fc1\.layer_norm_weight)",
         lambda m, g: Replicated(megatron=m[0], hf=_hf(m, "post_attention_layernorm.weight"))),
        (_L + r"self_attention\.linear_qkv\.(?P<kind>weight|bias)", lambda m, g: FusedQKV(
            megatron=m[0], q=_hf(m, f"self_attn.q_proj.{m['kind']}"), k=_hf(m, f"self_attn.k_proj.{m['kind']}"),
            v=_hf(m, f"self_attn.v_proj.{m['kind']}"), num_heads=g.num_heads, num_query_groups=g.num_query_groups,
            head_dim=g.head_dim)),
        (_L + r"self_attention\.q_layernorm\.weight",
         lambda m, g: Replicated(megatron=m[0], hf=_hf(m, "self_attn.q_norm.weight"))),
        (_L + r"self_attention\.k_layernorm\.weight",
         lambda m, g: Replicated(megatron=m[0], hf=_hf(m, "self_attn.k_norm.weight"))),
        (_L + r"self_attention\.linear_proj\.weight",
         lambda m, g: Split(megatron=m[0], hf=_hf(m, "self_attn.o_proj.weight"), dim=1)),
        (_L + r"mlp\.linear_fc1\.weight", lambda m, g: Gated(
            megatron=m[0], gate=_hf(m, "mlp.gate_proj.weight"), up=_hf(m, "mlp.up_proj.weight"))),
        (_L + r"mlp\.linear_fc2\.weight", lambda m, g: Split(megatron=m[0], hf=_hf(m, "mlp.down_proj.weight"), dim=1)),
        (_L + r"mlp\.router\.weight", lambda m, g: Replicated(megatron=m[0], hf=_hf(m, "mlp.gate.weight"))),
        # One expert per parameter: SequentialMLP (local_experts.E) and TE grouped (linear_fc1.weightE); E global.
        (_L + r"mlp\.experts\.(local_experts\.(?P<e>\d+)\.linear_fc1\.weight|linear_fc1\.weight(?P<te>\d+))",
         lambda m, g: Gated(
             megatron=m[0], axis="etp", expert=int(m["e"] or m["te"]), num_experts=g.num_experts,
             gate=_expert_hf(m, "gate_proj").format(expert=m["e"] or m["te"]),
             up=_expert_hf(m, "up_proj").format(expert=m["e"] or m["te"]))),
        (_L + r"mlp\.experts\.(local_experts\.(?P<e>\d+)\.linear_fc2\.weight|linear_fc2\.weight(?P<te>\d+))",
         lambda m, g: Split(
             megatron=m[0], axis="etp", dim=1, expert=int(m["e"] or m["te"]), num_experts=g.num_experts,
             hf=_expert_hf(m, "down_proj").format(expert=m["e"] or m["te"]))),
        # Legacy GroupedMLP (megatron-core <= 0.16): all of a layer's local experts in one weight1 / weight2.
        (_L + r"mlp\.experts\.weight1", lambda m, g: GroupedFc1(
            megatron=m[0], num_experts=g.num_experts, hidden=g.hidden, ffn=g.moe_ffn,
            gate=_expert_hf(m, "gate_proj"), up=_expert_hf(m, "up_proj"))),
        (_L + r"mlp\.experts\.weight2", lambda m, g: GroupedFc2(
            megatron=m[0], num_experts=g.num_experts, hidden=g.hidden, ffn=g.moe_ffn,
            down=_expert_hf(m, "down_proj"))),
    ]
    if not tied:
        rules.append((r"output_layer\.weight", lambda m, g: Split(
            megatron=m[0], hf="lm_head.weight", padded_rows=g.padded_vocab, unpadded_rows=g.vocab)))
    else:  # tied: the output layer (PP > 1) is a copy of the embedding; it produces nothing of its own
        rules.append((r"output_layer\.weight", lambda m, g: Split(
            megatron=m[0], hf=embed, padded_rows=g.padded_vocab, unpadded_rows=g.vocab)))
    return rules


_NH = "backbone.layers.{layer}."


def _nh(m: re.Match[str], suffix: str) -> str:
    return _NH.format(layer=m["layer"]) + suffix


def _mamba(m: re.Match[str], g: Geometry) -> dict[str, int]:
    return {"heads": g.mamba_heads, "head_dim": g.mamba_head_dim, "groups": g.mamba_groups, "state": g.mamba_state}


def _nemotron_h_rules(tied: bool) -> list[Rule]:
    """NemotronH (HybridModel): Mamba `M`, attention `*`, squared-ReLU MLP `-` and MoE `E` layers, each one pre-norm.

    Every layer's single norm is HF `backbone.layers.N.norm.weight`, whichever Megatron module holds it (local
    spec: `norm` / `input_layernorm` / `pre_mlp_layernorm`; TE spec: the fused linear's `layer_norm_weight`).
    """
    rules: list[Rule] = [
        (r"embedding\.word_embeddings\.weight", lambda m, g: Split(
            megatron=m[0], hf="backbone.embeddings.weight", padded_rows=g.padded_vocab, unpadded_rows=g.vocab)),
        (r"output_layer\.weight", lambda m, g: Split(
            megatron=m[0], hf="backbone.embeddings.weight" if tied else "lm_head.weight",
            padded_rows=g.padded_vocab, unpadded_rows=g.vocab)),
        (r"decoder\.(final_norm|final_layernorm)\.weight",
         lambda m, g: Replicated(megatron=m[0], hf="backbone.norm_f.weight")),
        (_L + r"(norm\.weight|input_layernorm\.weight|pre_mlp_layernorm\.weight|mixer\.in_proj\.layer_norm_weight"
         r"|self_attention\.linear_qkv\.layer_norm_weight|mlp\.linear_fc1\.layer_norm_weight)",
         lambda m, g: Replicated(megatron=m[0], hf=_nh(m, "norm.weight"))),
        # Mamba mixer
        (_L + r"mixer\.in_proj\.weight",
         lambda m, g: mamba_in_proj(megatron=m[0], hf=_nh(m, "mixer.in_proj.weight"), **_mamba(m, g))),
        (_L + r"mixer\.conv1d[._](?P<kind>weight|bias)",
         lambda m, g: mamba_conv1d(megatron=m[0], hf=_nh(m, f"mixer.conv1d.{m['kind']}"), **_mamba(m, g))),
        (_L + r"mixer\.(?P<p>A_log|D|dt_bias|norm\.weight)",
         lambda m, g: Split(megatron=m[0], hf=_nh(m, f"mixer.{m['p']}"))),
        (_L + r"mixer\.out_proj\.weight", lambda m, g: Split(megatron=m[0], hf=_nh(m, "mixer.out_proj.weight"), dim=1)),
        # Attention
        (_L + r"self_attention\.linear_qkv\.weight", lambda m, g: FusedQKV(
            megatron=m[0], q=_nh(m, "mixer.q_proj.weight"), k=_nh(m, "mixer.k_proj.weight"),
            v=_nh(m, "mixer.v_proj.weight"), num_heads=g.num_heads, num_query_groups=g.num_query_groups,
            head_dim=g.head_dim)),
        (_L + r"self_attention\.linear_proj\.weight",
         lambda m, g: Split(megatron=m[0], hf=_nh(m, "mixer.o_proj.weight"), dim=1)),
        # Dense MLP (not gated) and MoE
        (_L + r"mlp\.linear_fc1\.weight", lambda m, g: Split(megatron=m[0], hf=_nh(m, "mixer.up_proj.weight"))),
        (_L + r"mlp\.linear_fc2\.weight",
         lambda m, g: Split(megatron=m[0], hf=_nh(m, "mixer.down_proj.weight"), dim=1)),
        (_L + r"mlp\.router\.weight", lambda m, g: Replicated(megatron=m[0], hf=_nh(m, "mixer.gate.weight"))),
        (_L + r"mlp\.router\.expert_bias",
         lambda m, g: Replicated(megatron=m[0], hf=_nh(m, "mixer.gate.e_score_correction_bias"))),
        (_L + r"mlp\.shared_experts\.linear_fc1\.weight",
         lambda m, g: Split(megatron=m[0], hf=_nh(m, "mixer.shared_experts.up_proj.weight"))),
        (_L + r"mlp\.shared_experts\.linear_fc2\.weight",
         lambda m, g: Split(megatron=m[0], hf=_nh(m, "mixer.shared_experts.down_proj.weight"), dim=1)),
        (_L + r"mlp\.experts\.(local_experts\.(?P<e>\d+)\.linear_fc1\.weight|linear_fc1\.weight(?P<te>\d+))",
         lambda m, g: Split(
             megatron=m[0], axis="etp", expert=int(m["e"] or m["te"]), num_experts=g.num_experts,
             hf=_nh(m, f"mixer.experts.{m['e'] or m['te']}.up_proj.weight"))),
        (_L + r"mlp\.experts\.(local_experts\.(?P<e>\d+)\.linear_fc2\.weight|linear_fc2\.weight(?P<te>\d+))",
         lambda m, g: Split(
             megatron=m[0], axis="etp", dim=1, expert=int(m["e"] or m["te"]), num_experts=g.num_experts,
             hf=_nh(m, f"mixer.experts.{m['e'] or m['te']}.down_proj.weight"))),
    ]
    return rules


ARCHITECTURES: dict[str, Callable[[bool], list[Rule]]] = {
    "NemotronHForCausalLM": _nemotron_h_rules,
    "LlamaForCausalLM": _rules,
    "Qwen2ForCausalLM": _rules,
    "Qwen3ForCausalLM": _rules,
    "Qwen3MoeForCausalLM": _rules,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class MappingRegistry:
    """Megatron global name -> its mapping, for one model; `problems` is empty when built strictly."""

    architecture: str
    mappings: dict[str, TensorMapping]
    problems: tuple[str, ...] = ()
    """Coverage problems found (only non-empty when built with strict=False)."""
    copies: frozenset[str] = field(default_factory=frozenset)
    """Megatron names that copy another parameter's HF tensor (tied output layer) and produce nothing."""

    def get(self, megatron: str) -> TensorMapping | None:
        return self.mappings.get(megatron)


def build_registry(
    architecture: str,
    geometry: Geometry,
    megatron_names: Iterable[str],
    hf_names: Iterable[str],
    *,
    tied: bool = False,
    strict: bool = True,
) -> MappingRegistry:
    """Map every Megatron name once; strict: CoverageError names every unmapped or doubly mapped parameter and
    every HF tensor produced zero or two+ times."""
    if architecture not in ARCHITECTURES:
        raise MappingError(f"no explicit mappings for {architecture}; known: {', '.join(sorted(ARCHITECTURES))}")
    rules = [(re.compile(pattern), make) for pattern, make in ARCHITECTURES[architecture](tied)]
    problems: list[str] = []
    mappings: dict[str, TensorMapping] = {}
    copies: set[str] = set()
    for name in sorted(set(megatron_names)):
        hits = [(p, make) for p, make in rules if p.fullmatch(name)]
        if not hits:
            problems.append(f"{name}: Megatron parameter has no mapping")
            continue
        if len(hits) > 1:
            patterns = ", ".join(p.pattern for p, _ in hits)
            problems.append(f"{name}: Megatron parameter has {len(hits)} mappings ({patterns})")
            continue
        pattern, make = hits[0]
        mappings[name] = make(pattern.fullmatch(name), geometry)  # type: ignore[arg-type]
        if tied and name == "output_layer.weight":
            copies.add(name)
    produced = Counter(hf for name, m in mappings.items() if name not in copies for hf in m.hf_names)
    wanted = set(hf_names)
    for hf in sorted(wanted | set(produced)):
        count = produced.get(hf, 0)
        if hf not in wanted:
            problems.append(f"{hf}: produced by a mapping but not an HF tensor of the model")
        elif count != 1:
            problems.append(f"{hf}: HF tensor would be produced {count} times")
    if problems and strict:
        head = f"mappings for {architecture} do not cover the model exactly once: "
        raise CoverageError(head + "; ".join(sorted(problems)))
    return MappingRegistry(
        architecture=architecture, mappings=mappings, problems=tuple(sorted(problems)), copies=frozenset(copies)
    )
