"""Each parameter's reshard role, read from the real bridge mapping class of its conversion task (never its name)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from convcheck.verdict import Finding

KINDS = ("qkv", "gated", "column", "row", "replicated")
"""qkv: QKVMapping; gated: GatedMLPMapping; column/row/replicated: the parallel mappings (AutoMapping resolved)."""

_EXPERT_ID = re.compile(r"\.local_experts\.(\d+)\.")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamRole:
    """One Megatron parameter as the reshard sees it (the same on every rank that holds it)."""

    name: str
    """Global Megatron name (layer and expert numbers global)."""
    kind: str
    """One of KINDS, from the bridge mapping class."""
    core_split: str
    """column, row or replicated, from megatron-core's own partition attributes on the parameter."""
    hf: tuple[str, ...]
    """HF tensors: (q, k, v) for qkv, (gate, up) for gated, else one."""
    hf_shapes: tuple[tuple[int, ...], ...]
    expert: int | None
    """Global expert id, or None for a dense parameter."""
    heads: tuple[int, int, int] | None = None
    """qkv only: (num_heads, num_kv_heads, head_dim)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Shard:
    """Where one trainer rank holds one parameter: shard `index` of `count` along the role's split."""

    rank: int
    local: str
    """The key in that rank's shard dict."""
    index: int
    count: int
    shape: tuple[int, ...]
    dtype: str


def megatron_name(task: Any) -> str:
    """The name a parameter is planned and compared under: the task's global Megatron name."""
    return task.global_param_name


def bridge_kind(mapping: Any, module: Any) -> str | None:
    """The role kind of a bridge mapping (AutoMapping resolved the way the bridge resolves it); None if unknown."""
    from megatron.bridge.models.conversion import param_mapping as pm

    if type(mapping) is pm.AutoMapping:
        if getattr(mapping, "permute_dims", None):
            return None
        mapping = mapping._get_or_create_mapping(mapping._detect_parallelism_type(module))
    kinds = {
        pm.QKVMapping: "qkv",
        pm.GatedMLPMapping: "gated",
        pm.ColumnParallelMapping: "column",
        pm.RowParallelMapping: "row",
        pm.ReplicatedMapping: "replicated",
    }
    return kinds.get(type(mapping))


def core_split(param: Any) -> str:
    """column / row / replicated from megatron-core's `tensor_model_parallel` and `partition_dim` attributes."""
    if not getattr(param, "tensor_model_parallel", False):
        return "replicated"
    return {0: "column", 1: "row"}.get(getattr(param, "partition_dim", -1), "replicated")


def _hf_names(mapping: Any, kind: str) -> tuple[str, ...]:
    hf = mapping.hf_param
    if kind == "qkv":
        return (hf["q"], hf["k"], hf["v"])
    if kind == "gated":
        return (hf["gate"], hf["up"])
    return (hf,) if isinstance(hf, str) else tuple(hf.values())


def collect(ctx: Any) -> tuple[list[tuple[ParamRole, Shard]], dict[str, Any], list[Finding]]:
    """This rank's (role, shard) records, its shards by local key, and a finding per underivable role."""
    config = ctx.model[0].config
    heads = (config.num_attention_heads, config.num_query_groups or config.num_attention_heads, config.kv_channels)
    records: list[tuple[ParamRole, Shard]] = []
    tensors: dict[str, Any] = {}
    findings: list[Finding] = []
    for task in ctx.bridge.get_conversion_tasks(ctx.model):
        if task is None or task.param_weight is None:
            continue
        name, mapping, param = megatron_name(task), task.mapping, task.param_weight
        kind = bridge_kind(mapping, task.megatron_module)
        if kind is None:
            findings.append(
                Finding(
                    tensor=name,
                    kind="role-underivable",
                    message=f"{type(mapping).__name__} on rank {ctx.rank} has no reshard role (qkv, gated, column, "
                    "row, replicated); add one to convcheck.reshard.roles.bridge_kind",
                    detail={"rank": ctx.rank, "mapping": type(mapping).__name__},
                )
            )
            continue
        hf = _hf_names(mapping, kind)
        missing = [h for h in hf if h not in ctx.checkpoint.tensors]
        if missing:
            findings.append(Finding(tensor=name, kind="hf-missing", message=f"HF tensor(s) {missing} not on disk"))
            continue
        is_expert = bool(getattr(mapping, "is_expert", False))
        match = _EXPERT_ID.search(name) if is_expert else None
        role = ParamRole(
            name=name,
            kind=kind,
            core_split=core_split(param),
            hf=hf,
            hf_shapes=tuple(tuple(ctx.checkpoint.tensors[h].shape) for h in hf),
            expert=int(match.group(1)) if match else None,
            heads=heads if kind == "qkv" else None,
        )
        index, count = (ctx.coord.etp_rank, ctx.layout.etp) if is_expert else (ctx.coord.tp_rank, ctx.layout.tp)
        local = f"{task.vp_stage}:{task.param_name}"
        shard = Shard(
            rank=ctx.rank,
            local=local,
            index=index,
            count=count,
            shape=tuple(param.shape),
            dtype=str(param.dtype).removeprefix("torch."),
        )
        records.append((role, shard))
        tensors[local] = param.detach()
    return records, tensors, findings


def merge(
    gathered: list[list[tuple[ParamRole, Shard]]],
) -> tuple[dict[str, ParamRole], dict[str, list[Shard]], list[Finding]]:
    """Roles and trainer shards by name from every rank's records; ranks disagreeing on a role is a finding."""
    roles: dict[str, ParamRole] = {}
    shards: dict[str, list[Shard]] = {}
    findings: list[Finding] = []
    for records in gathered:
        for role, shard in records:
            known = roles.setdefault(role.name, role)
            if known != role:
                findings.append(
                    Finding(
                        tensor=role.name,
                        kind="role-conflict",
                        message=f"rank {shard.rank} holds it as {role.kind} of {list(role.hf)}, another rank as "
                        f"{known.kind} of {list(known.hf)}",
                        detail={"rank": shard.rank},
                    )
                )
            shards.setdefault(role.name, []).append(shard)
    return roles, shards, findings


def role_mismatch(role: ParamRole) -> Finding | None:
    """A finding when the bridge's role disagrees with megatron-core's partition attributes for the parameter."""
    expected = "column" if role.kind in ("qkv", "gated") else role.kind
    if expected == role.core_split:
        return None
    return Finding(
        tensor=role.name,
        kind="role-mismatch",
        message=f"the bridge mapping makes it {role.kind}; megatron-core partitions it as {role.core_split}",
        detail={"bridge": role.kind, "core": role.core_split},
    )
