"""Planted bugs for the differential, elements, layout and roundtrip-diagnosis tests.

`convcheck verify --hook convcheck.mutants.collectives:NAME` runs NAME in every rank before the model is built;
each patches a real Megatron-Bridge class the way a real conversion bug would look.
"""

from __future__ import annotations

import re

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.param_mapping import (
    ColumnParallelMapping,
    GatedMLPMapping,
    MegatronParamMapping,
    QKVMapping,
)

from convcheck.mutants.patch import wrap


def tp_concat_reversed() -> None:
    """The TP gather hands back the shards in reverse rank order, for the word embeddings only."""

    def make(original):  # type: ignore[no-untyped-def]
        def gather_from_tp_ranks(self, tensor):  # type: ignore[no-untyped-def]
            out = original(self, tensor)
            return out[::-1] if "embedding.word_embeddings" in self.megatron_param else out

        return gather_from_tp_ranks

    wrap(MegatronParamMapping, "gather_from_tp_ranks", make)


def ep_local_ids() -> None:
    """The EP gather names every gathered expert with its local id (last rank wins), in layer 1."""

    def make(original):  # type: ignore[no-untyped-def]
        def gather_from_ep_ranks(self, weights, module, hf_param_name):  # type: ignore[no-untyped-def]
            out = original(self, weights, module, hf_param_name)
            if ".layers.1." not in str(hf_param_name) or self.ep_size == 1:
                return out
            per_rank = self._get_config(module).num_moe_experts // self.ep_size
            return {
                re.sub(r"experts\.(\d+)", lambda m: f"experts.{int(m.group(1)) % per_rank}", n): t
                for n, t in out.items()
            }

        return gather_from_ep_ranks

    wrap(MegatronParamMapping, "gather_from_ep_ranks", make)


def gqa_qk_swap_group1() -> None:
    """QKV export swaps the first q head of query group 1 with group 1's k head, in layer 0."""

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, weights, module):  # type: ignore[no-untyped-def]
            out = original(self, weights, module)
            q_name = next((n for n in out if n.endswith("q_proj.weight") and ".layers.0." in n), None)
            if q_name:
                k_name = q_name.replace("q_proj", "k_proj")
                q, k = out[q_name].clone(), out[k_name].clone()
                head = k.shape[0] // 2  # 2 KV heads: one group's k rows
                heads_per_group = q.shape[0] // k.shape[0]
                q0 = head * heads_per_group  # first q head of group 1
                q[q0 : q0 + head], k[head:] = out[k_name][head:], out[q_name][q0 : q0 + head]
                out = {**out, q_name: q, k_name: k}
            return out

        return megatron_to_hf

    wrap(QKVMapping, "megatron_to_hf", make)


def gate_up_swapped_under_tp() -> None:
    """Under TP the gate/up split takes rank 1's halves from the wrong side (layer 0 dense MLP)."""

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, weights, module):  # type: ignore[no-untyped-def]
            out = original(self, weights, module)
            if self.tp_size == 1 or self.is_expert or ".layers.0." not in self.megatron_param:
                return out
            gate_name, up_name = self.hf_param["gate"], self.hf_param["up"]
            if gate_name not in out:
                return out
            gate, up = out[gate_name], out[up_name]
            half = gate.shape[0] // self.tp_size
            g = gate.clone()
            u = up.clone()
            g[half:], u[half:] = up[half:], gate[half:]
            return {**out, gate_name: g, up_name: u}

        return megatron_to_hf

    wrap(GatedMLPMapping, "megatron_to_hf", make)


def etp_not_gathered() -> None:
    """The expert-tensor-parallel gather is skipped: each rank exports only its own expert shard."""

    def make(original):  # type: ignore[no-untyped-def]
        def gather_from_tp_ranks(self, tensor):  # type: ignore[no-untyped-def]
            return [tensor] if self.is_expert else original(self, tensor)

        return gather_from_tp_ranks

    wrap(MegatronParamMapping, "gather_from_tp_ranks", make)


def drop_vocab_rows() -> None:
    """The lm_head export silently drops its last 8 rows (vocab padding removed with the wrong size)."""

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, weights, module):  # type: ignore[no-untyped-def]
            out = original(self, weights, module)
            return {n: (t[:-8] if n == "lm_head.weight" else t) for n, t in out.items()}

        return megatron_to_hf

    wrap(ColumnParallelMapping, "megatron_to_hf", make)


def etp_halves_swapped() -> None:
    """The expert-tensor-parallel gather hands back the ETP shards in reverse order, for layer 1's experts."""

    def make(original):  # type: ignore[no-untyped-def]
        def gather_from_tp_ranks(self, tensor):  # type: ignore[no-untyped-def]
            out = original(self, tensor)
            return out[::-1] if self.is_expert and ".layers.1." in self.megatron_param else out

        return gather_from_tp_ranks

    wrap(MegatronParamMapping, "gather_from_tp_ranks", make)


def ep_not_gathered() -> None:
    """The EP gather is skipped for layer 0's expert down projections: each rank exports only its own experts."""

    def make(original):  # type: ignore[no-untyped-def]
        def gather_from_ep_ranks(self, weights, module, hf_param_name):  # type: ignore[no-untyped-def]
            if ".layers.0." in str(hf_param_name) and "linear_fc2" in self.megatron_param:
                return {str(hf_param_name): weights}
            return original(self, weights, module, hf_param_name)

        return gather_from_ep_ranks

    wrap(MegatronParamMapping, "gather_from_ep_ranks", make)


def qkv_groups_reversed() -> None:
    """QKV export splits layer 1's query groups in reverse order (group g's q, k, v land at group G-1-g)."""

    def make(original):  # type: ignore[no-untyped-def]
        def megatron_to_hf(self, weights, module):  # type: ignore[no-untyped-def]
            out = original(self, weights, module)
            if ".layers.1." not in self.megatron_param or module is None or not out:
                return out
            groups = self._get_config(module).num_query_groups
            return {n: t.reshape(groups, -1, *t.shape[1:]).flip(0).reshape(t.shape) for n, t in out.items()}

        return megatron_to_hf

    wrap(QKVMapping, "megatron_to_hf", make)


def ep_gather_stale_off_rank0() -> None:
    """EP ranks other than 0 discard the gather's result for layer 0's expert up/gate projections and hand back
    their own expert under every global id: rank 0's export is right, the other ranks send wrong experts."""

    def make(original):  # type: ignore[no-untyped-def]
        def gather_from_ep_ranks(self, weights, module, hf_param_name):  # type: ignore[no-untyped-def]
            out = original(self, weights, module, hf_param_name)  # every rank still joins the collective
            if self.ep_rank == 0 or ".layers.0." not in str(hf_param_name) or "linear_fc1" not in self.megatron_param:
                return out
            own = list(out.values())[self.ep_rank]
            return {name: own.clone() for name in out}

        return gather_from_ep_ranks

    wrap(MegatronParamMapping, "gather_from_ep_ranks", make)
