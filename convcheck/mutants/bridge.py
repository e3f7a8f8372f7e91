"""Planted export/import bugs: `convcheck verify --hook convcheck.mutants.bridge:NAME` runs NAME in every rank.

Each patches a real Megatron-Bridge class the way a real conversion bug would look; the tests assert the
oracles catch it and name the tensor.
"""

from __future__ import annotations

from convcheck.mutants import wrap


def swap_qk_head0() -> None:
    """QKVMapping export writes k's head-0 rows into q and q's into k, in layer 0 only."""
    from megatron.bridge.models.conversion.param_mapping import QKVMapping

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
    from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge

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
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, megatron_weights, megatron_module):  # type: ignore[no-untyped-def]
            out = original(self, megatron_weights, megatron_module)
            return {n: (t.t().contiguous() if n == "model.layers.0.self_attn.o_proj.weight" else t) for n, t in out.items()}

        return megatron_to_hf

    wrap(AutoMapping, "megatron_to_hf", make)


def skip_load_final_norm() -> None:
    """The import of the final norm writes nothing: the parameter keeps its init values."""
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    def make(original):  # type: ignore[no-untyped-def]
        def hf_to_megatron(self, hf_weights, megatron_module):  # type: ignore[no-untyped-def]
            if self.megatron_param == "decoder.final_layernorm.weight":
                return megatron_module.weight.detach().clone()
            return original(self, hf_weights, megatron_module)

        return hf_to_megatron

    wrap(AutoMapping, "hf_to_megatron", make)


def unmap_router() -> None:
    """The mapping registry forgets layer 0's router: no mapping, a warning upstream, nothing else."""
    from megatron.bridge.models.conversion.mapping_registry import MegatronMappingRegistry

    def make(original):  # type: ignore[no-untyped-def]
        def lookup(self, megatron_param_name):  # type: ignore[no-untyped-def]
            if megatron_param_name == "decoder.layers.0.mlp.router.weight":
                return None
            return original(self, megatron_param_name)

        return lookup

    wrap(MegatronMappingRegistry, "megatron_to_hf_lookup", make)

