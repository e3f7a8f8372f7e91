"""Planted export/import bugs: `convcheck verify --hook convcheck.mutants.bridge:NAME` runs NAME in every rank.

Each patches a real Megatron-Bridge class the way a real conversion bug would look; the tests assert the
oracles catch it and name the tensor.
"""

from __future__ import annotations

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

import torch
from megatron.bridge.models.conversion import model_bridge
from megatron.bridge.models.conversion.mapping_registry import MegatronMappingRegistry
from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
from megatron.bridge.models.conversion.param_mapping import AutoMapping, GatedMLPMapping, QKVMapping
from megatron.bridge.models.conversion.utils import unwrap_model

from convcheck.compare.bits import int_view
from convcheck.mutants.patch import alter_provider, wrap


def swap_qk_head0() -> None:
    """QKVMapping export writes k's head-0 rows into q and q's into k, in layer 0 only."""

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            q_name = next((n for n in out if n.endswith("q_proj.weight") and ".layers.0." in n), None)
            if q_name:
                k_name = q_name.replace("q_proj", "k_proj")
                q, k = out[q_name].clone(), out[k_name].clone()
                rows = k.shape[0] // 2  # one head of a 2-KV-head model
                q[:rows], k[:rows] = out[k_name][:rows], out[q_name][:rows]
                out = {**out, q_name: q, k_name: k}
            return out

        return megatron_to_hf

    wrap(QKVMapping, "megatron_to_hf", make)


def _patch_stream(transform) -> None:  # type: ignore[no-untyped-def]
    """Wrap the bridge's own export generator with `transform(name, tensor) -> list of (name, tensor)`."""

    def make(original):  # type: ignore[no-untyped-def]
        def stream(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            for name, tensor in original(self, *args, **kwargs):
                yield from transform(name, tensor)

        return stream

    wrap(MegatronModelBridge, "stream_weights_megatron_to_hf", make)


def drop_expert3() -> None:
    """The export silently skips every tensor of expert 3 in layer 1 (an expert not gathered)."""
    _patch_stream(lambda n, t: [] if ".layers.1.mlp.experts.3." in n else [(n, t)])


def duplicate_name() -> None:
    """The export emits model.norm.weight twice."""
    _patch_stream(lambda n, t: [(n, t), (n, t)] if n == "model.norm.weight" else [(n, t)])


def dtype_change() -> None:
    """The export casts one tensor to float32."""
    _patch_stream(lambda n, t: [(n, t.float() if n.endswith("layers.0.post_attention_layernorm.weight") else t)])


def transpose_o_proj() -> None:
    """RowParallelMapping export returns layer 0's o_proj transposed (square, so only the bytes show it)."""

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            return {
                n: (t.t().contiguous() if n == "model.layers.0.self_attn.o_proj.weight" else t) for n, t in out.items()
            }

        return megatron_to_hf

    wrap(AutoMapping, "megatron_to_hf", make)


def skip_load_final_norm() -> None:
    """The import of the final norm writes nothing: the parameter keeps its init values."""

    def make(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            if self.megatron_param == "decoder.final_layernorm.weight":
                return megatron_module.weight.detach().clone()
            return original(self, hf_weights, megatron_module)

        return hf_to_megatron

    wrap(AutoMapping, "hf_to_megatron", make)


def unmap_router() -> None:
    """The mapping registry forgets layer 0's router: no mapping, a warning upstream, nothing else."""

    def make(original):  # type: ignore[no-untyped-def]
        def lookup(self, megatron_param_name):  # type: ignore[no-untyped-def]
            if megatron_param_name == "decoder.layers.0.mlp.router.weight":
                return None
            return original(self, megatron_param_name)

        return lookup

    wrap(MegatronMappingRegistry, "megatron_to_hf_lookup", make)


def _patch_model_stream(transform) -> None:  # type: ignore[no-untyped-def]
    """Like `_patch_stream`, with access to the bridge and model: `transform(bridge, models, stream)` yields pairs."""

    def make(original):  # type: ignore[no-untyped-def]
        def stream(self, megatron_model, *args, **kwargs):  # type: ignore[no-untyped-def]
            yield from transform(self, megatron_model, original(self, megatron_model, *args, **kwargs))

        return stream

    wrap(MegatronModelBridge, "stream_weights_megatron_to_hf", make)


def _wrap_import(mapping_cls: type, change) -> None:  # type: ignore[no-untyped-def]
    """`mapping_cls.hf_to_megatron` runs as usual (collectives included), then `change(mapping, module, shard)`."""

    def make(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            return change(self, megatron_module, original(self, hf_weights, megatron_module))

        return hf_to_megatron

    wrap(mapping_cls, "hf_to_megatron", make)


def _wrap_export(mapping_cls: type, change) -> None:  # type: ignore[no-untyped-def]
    """`mapping_cls.megatron_to_hf` runs as usual (collectives included), then `change(mapping, module, out)`."""

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            return change(self, megatron_module, original(self, megatron_weights, megatron_module))

        return megatron_to_hf

    wrap(mapping_cls, "megatron_to_hf", make)


def drop_hf_name() -> None:
    """The export silently skips model.layers.1.input_layernorm.weight (a name lost in a rename table)."""
    _patch_stream(lambda n, t: [] if n == "model.layers.1.input_layernorm.weight" else [(n, t)])


def downcast_router_bias() -> None:
    """The export casts the float32 router expert bias (e_score_correction_bias: NemotronH, DeepSeek-V3) to bfloat16."""
    _patch_stream(lambda n, t: [(n, t.to(torch.bfloat16) if n.endswith("gate.e_score_correction_bias") else t)])


def gate_up_swapped() -> None:
    """GatedMLPMapping export names layer 1's gate rows up_proj and its up rows gate_proj (any layout)."""

    def change(mapping, _module, out):  # type: ignore[no-untyped-def]
        gate, up = mapping.hf_param["gate"], mapping.hf_param["up"]
        if mapping.is_expert or ".layers.1." not in mapping.megatron_param or gate not in out:
            return out
        return {**out, gate: out[up], up: out[gate]}

    _wrap_export(GatedMLPMapping, change)


def drop_qkv_bias() -> None:
    """QKVMapping export of layer 0's fused qkv bias returns nothing: q/k/v_proj.bias are never written."""

    def change(mapping, _module, out):  # type: ignore[no-untyped-def]
        return {} if mapping.megatron_param == "decoder.layers.0.self_attention.linear_qkv.bias" else out

    _wrap_export(QKVMapping, change)


def flip_one_bit() -> None:
    """The import flips the lowest bit of element [0, 0] of layer 1's linear_fc2 (down_proj) on TP rank 0."""

    def change(mapping, _module, shard):  # type: ignore[no-untyped-def]
        if mapping.megatron_param != "decoder.layers.1.mlp.linear_fc2.weight" or mapping.tp_rank != 0:
            return shard
        shard = shard.clone()
        int_view(shard).view(-1)[0] ^= 1
        return shard

    _wrap_import(AutoMapping, change)


def norm_zero_centered() -> None:
    """Layer 1's MLP RMSNorm goes through the zero-centred-gamma conversion (import w-1, export +1) though the
    model's norm is not zero-centred: the stored gamma is off by one and w-1+1 loses low bits in bf16."""
    target = "decoder.layers.1.pre_mlp_layernorm.weight"

    def make_import(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            if self.megatron_param == target and hf_weights is not None:
                hf_weights = hf_weights - 1
            return original(self, hf_weights, megatron_module)

        return hf_to_megatron

    def change_export(mapping, _module, out):  # type: ignore[no-untyped-def]
        return {n: t + 1 for n, t in out.items()} if mapping.megatron_param == target else out

    wrap(AutoMapping, "hf_to_megatron", make_import)
    _wrap_export(AutoMapping, change_export)


def expert_left_at_init() -> None:
    """The import of layer 0's expert 5 linear_fc1 (gate|up) writes nothing: the expert keeps its init values."""

    def change(mapping, module, shard):  # type: ignore[no-untyped-def]
        if mapping.megatron_param != "decoder.layers.0.mlp.experts.local_experts.5.linear_fc1.weight":
            return shard
        return module.weight.detach().clone()

    _wrap_import(GatedMLPMapping, change)


def vocab_padding_leaked() -> None:
    """The provider pads the vocab for TP (should_pad_vocab) and the export never strips the padding rows."""
    alter_provider(lambda p: setattr(p, "should_pad_vocab", True))


def tied_embedding_not_emitted() -> None:
    """With tied embeddings at PP>1 the export drops the stage-0 word embeddings as the output layer's duplicate."""

    def transform(_bridge, models, stream):  # type: ignore[no-untyped-def]
        chunks = models if isinstance(models, list) else [models]
        config = unwrap_model(chunks)[0].config
        drop = config.share_embeddings_and_output_weights and config.pipeline_model_parallel_size > 1
        for name, tensor in stream:
            if not (drop and name.endswith("embed_tokens.weight")):
                yield name, tensor

    _patch_model_stream(transform)


def pp_layer_off_by_one() -> None:
    """Local-to-global layer renumbering is one short on every PP stage after the first (import and export)."""
    import re

    def make(original):  # type: ignore[no-untyped-def]
        def local_to_global(models, config, param_name, vp_stage=None):  # type: ignore[no-untyped-def]
            name = original(models, config, param_name, vp_stage)
            if model_bridge._get_pp_rank(models) == 0 or "layers." not in name:
                return name
            return re.sub(r"layers\.(\d+)\.", lambda m: f"layers.{max(int(m.group(1)) - 1, 0)}.", name, count=1)

        return local_to_global

    wrap(model_bridge, "_megatron_local_name_to_global", make)


def export_nonpersistent_buffer() -> None:
    """The export walks every registered buffer, persistent or not: a router's `local_tokens_per_expert` counter
    is written under the HF prefix of its module."""

    def transform(bridge, models, stream):  # type: ignore[no-untyped-def]
        yield from stream
        registry = bridge.mapping_registry()
        for chunk in unwrap_model(models if isinstance(models, list) else [models]):
            for prefix, module in chunk.named_modules():
                skipped = getattr(module, "_non_persistent_buffers_set", set())
                sibling = next((n for n, _ in module.named_parameters(recurse=False)), None)
                mapping = registry.megatron_to_hf_lookup(f"{prefix}.{sibling}") if sibling and skipped else None
                if mapping is None or not isinstance(mapping.hf_param, str):
                    continue
                for name in sorted(skipped):
                    buffer = getattr(module, name)
                    if buffer is not None:
                        yield mapping.hf_param.rpartition(".")[0] + f".{name}", buffer.detach().cpu().clone()

    _patch_model_stream(transform)
