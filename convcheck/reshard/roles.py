"""Each parameter's reshard role, read from the real bridge mapping class of its conversion task (never its name)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion import param_mapping as pm

from convcheck.verdict import Finding

KINDS = ("qkv", "gated", "sections", "column", "row", "replicated")
"""qkv: QKVMapping; gated: GatedMLPMapping; sections: the GDN in_proj / conv1d mappings (dim-0 sections, each
chunked over TP); column/row/replicated: the parallel mappings (AutoMapping and its value-offset subclass resolved)."""

SECTIONED = ("GDNLinearMapping", "GDNLinearMappingSeparate", "GDNConv1dMapping")
"""Bridge mapping classes whose Megatron tensor is dim-0 sections, each chunked over TP (megatron-core's GDN)."""

OFFSETS = {"RMSNorm2ZeroCenteredRMSNormMapping": 1.0}
"""AutoMapping subclasses that only shift values: what the export adds to the Megatron value (HF = Megatron + it)."""

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
    gate: bool = False
    """qkv only: megatron-core's attention_output_gate (per group [q heads; gate heads; k; v], HF q_proj per head
    [q; gate])."""
    sections: tuple[int, ...] = ()
    """sections only: Megatron's dim-0 section sizes of the whole tensor (each shard holds 1/tp of every one)."""
    hf_sections: tuple[tuple[int, ...], ...] = ()
    """sections only: per HF tensor, the global sizes of the sections it holds (in Megatron's section order)."""
    hf_groups: tuple[int, ...] = ()
    """sections only: per HF tensor, how many head groups interleave its sections (1: sections stored flat)."""
    offset: float = 0.0
    """Added to the moved Megatron value to give the target's (HF-convention) value: 1 for a zero-centered norm."""


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
    if type(mapping) in {getattr(pm, name) for name in SECTIONED}:
        return "sections"
    if type(mapping) in {pm.AutoMapping, *(getattr(pm, name) for name in OFFSETS)}:
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


def gdn_module(chunk: Any, local: str) -> Any:
    """The megatron-core GDN module that owns local parameter `local` (the nearest ancestor with split sections)."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    parts = local.split(".")
    for end in range(len(parts) - 1, 0, -1):
        module = chunk.get_submodule(".".join(parts[:end]))
        if hasattr(module, "in_proj_split_sections"):
            return module
    raise LookupError(f"{local} is not inside a megatron-core GatedDeltaNet")


def megatron_sections(module: Any, param: str, tp: int) -> tuple[int, ...]:
    """Global dim-0 sections of a GDN parameter from megatron-core's own per-rank split: in_proj
    [q, k, v, z, beta, alpha] (in_proj_split_sections), conv1d channels [q, k, v] (the first three)."""
    local = tuple(int(n) for n in module.in_proj_split_sections)
    return tuple(n * tp for n in (local[:3] if ".conv1d." in f".{param}" else local))


def hf_sections(mapping: Any, config: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Per HF tensor of a GDN mapping, its sections' global sizes and its head-group interleave (HF's layout, by
    mapping class): GDNLinearMapping qkvz [q, k, v, z] and ba [b, a] grouped per key head (Qwen3-Next);
    GDNLinearMappingSeparate flat qkv [q, k, v], z, b, a (Qwen3.5); GDNConv1dMapping flat channels [q, k, v]."""
    qk = config.linear_key_head_dim * config.linear_num_key_heads
    v = config.linear_value_head_dim * config.linear_num_value_heads
    nv, nk = config.linear_num_value_heads, config.linear_num_key_heads
    name = type(mapping).__name__
    if name == "GDNLinearMapping":
        return ((qk, qk, v, v), (nv, nv)), (nk, nk)
    if name == "GDNLinearMappingSeparate":
        return ((qk, qk, v), (v,), (nv,), (nv,)), (1, 1, 1, 1)
    return ((qk, qk, v),), (1,)


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
                    message=f"{type(mapping).__name__} on rank {ctx.rank} has no reshard role (qkv, gated, sections, "
                    "column, row, replicated); add one to convcheck.reshard.roles.bridge_kind",
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
        extra: dict[str, Any] = {"offset": OFFSETS.get(type(mapping).__name__, 0.0)}
        if kind == "qkv":
            extra |= {"heads": heads, "gate": bool(getattr(config, "attention_output_gate", False))}
        if kind == "sections":
            module = gdn_module(ctx.model[task.vp_stage or 0], task.param_name)
            sections, groups = hf_sections(mapping, config)
            extra |= {
                "sections": megatron_sections(module, task.param_name, ctx.layout.tp),
                "hf_sections": sections,
                "hf_groups": groups,
            }
        role = ParamRole(
            name=name,
            kind=kind,
            core_split=core_split(param),
            hf=hf,
            hf_shapes=tuple(tuple(ctx.checkpoint.tensors[h].shape) for h in hf),
            expert=int(match.group(1)) if match else None,
            **extra,
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
    expected = "column" if role.kind in ("qkv", "gated", "sections") else role.kind
    if expected == role.core_split:
        return None
    return Finding(
        tensor=role.name,
        kind="role-mismatch",
        message=f"the bridge mapping makes it {role.kind}; megatron-core partitions it as {role.core_split}",
        detail={"bridge": role.kind, "core": role.core_split},
    )
