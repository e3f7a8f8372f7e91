"""ParallelLayout and RankCoord: how a (TP, PP, EP, ETP) layout and one rank's place in it travel through convcheck."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from convcheck.errors import BadInput, MappingError
from convcheck.hf.geometry import Geometry

_LAYOUT_PART = re.compile(r"(etp|tp|pp|ep)(\d+)")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelLayout:
    """A Megatron parallel layout; world size is the smallest that fits both the dense and the expert grid."""

    tp: int = 1
    """Tensor parallel size (attention and dense MLP)."""
    pp: int = 1
    """Pipeline parallel size."""
    ep: int = 1
    """Expert parallel size."""
    etp: int = 1
    """Expert tensor parallel size (1: each expert whole on its EP rank)."""

    def __post_init__(self) -> None:
        for field_name in ("tp", "pp", "ep", "etp"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadInput(f"impossible layout: --{field_name} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        """Ranks needed: lcm of the dense grid (tp) and the expert grid (ep*etp), times pp."""
        return math.lcm(self.tp, self.ep * self.etp) * self.pp

    @property
    def label(self) -> str:
        """Short human label such as "TP2xEP2" or "TP1"."""
        parts = [
            f"{k.upper()}{v}"
            for k, v in (("tp", self.tp), ("pp", self.pp), ("ep", self.ep), ("etp", self.etp))
            if v > 1
        ]
        return "x".join(parts) or "TP1"

    @property
    def spec(self) -> str:
        """Compact spelling such as "tp2ep2" or "tp1" (what `parse` reads back)."""
        parts = [f"{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("ep", self.ep), ("etp", self.etp)) if v > 1]
        return "".join(parts) or "tp1"

    @classmethod
    def parse(cls, text: str) -> "ParallelLayout":
        """Read "tp2ep2", "TP2xEP2", "pp2", "tp2-ep2-etp2" (axes default to 1); BadInput on anything else."""
        cleaned = text.strip().lower().replace("x", "").replace("-", "").replace("_", "").replace(",", "")
        sizes: dict[str, int] = {}
        for axis, value in _LAYOUT_PART.findall(cleaned):
            if axis in sizes:
                raise BadInput(f"layout {text!r} names {axis} twice")
            sizes[axis] = int(value)
        if not cleaned or _LAYOUT_PART.sub("", cleaned):
            raise BadInput(f"layout {text!r} is not of the form tp2, tp2ep2, pp2, tp2ep2etp2")
        return cls(**sizes)

    def to_dict(self) -> dict[str, int]:
        """Plain dict including the world size (for JSON reports)."""
        return {**asdict(self), "world_size": self.world_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ParallelLayout":
        """Inverse of to_dict (world_size is derived, so ignored)."""
        return cls(**{k: int(data[k]) for k in ("tp", "pp", "ep", "etp") if k in data})

    def validate_for(self, config: dict[str, Any]) -> None:
        """Raise BadInput naming every constraint this layout breaks for an HF config dict (one line, first first)."""
        problems = self.problems_for(Geometry.from_hf_config(config))
        if problems:
            raise BadInput(f"impossible layout {self.label}: " + "; ".join(problems))

    def problems_for(self, geometry: Geometry) -> list[str]:
        """Every constraint this layout breaks for a model of `geometry` (empty when the layout is possible)."""
        heads, kv_heads, layers = geometry.num_heads, geometry.num_query_groups, geometry.num_layers
        experts, ffn = geometry.num_experts, geometry.ffn
        moe_ffn = geometry.moe_ffn or ffn
        out = []
        if heads and heads % self.tp:
            out.append(f"tp={self.tp} does not divide num_attention_heads={heads}")
        if kv_heads and kv_heads % self.tp and self.tp % kv_heads:  # Megatron-Core replicates KV heads when kv < tp
            out.append(f"tp={self.tp} neither divides nor is a multiple of num_key_value_heads={kv_heads}")
        if ffn and ffn % self.tp:
            out.append(f"tp={self.tp} does not divide intermediate_size={ffn}")
        if layers and layers % self.pp:
            out.append(f"pp={self.pp} does not divide num_hidden_layers={layers}")
        if not experts and (self.ep > 1 or self.etp > 1):
            out.append("the model has no experts, so ep and etp must be 1")
        for key, value in (("mamba_num_heads", geometry.mamba_heads), ("n_groups", geometry.mamba_groups)):
            if value and geometry.has_mamba_layers and value % self.tp:
                out.append(f"tp={self.tp} does not divide {key}={value}")
        if experts and experts % self.ep:
            out.append(f"ep={self.ep} does not divide num_experts={experts}")
        if experts and moe_ffn and moe_ffn % self.etp:
            out.append(f"etp={self.etp} does not divide moe_intermediate_size={moe_ffn}")
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class RankCoord:
    """Where one rank sits in the parallel grid (only the axes a mapping uses matter to it)."""

    tp_rank: int = 0
    """Tensor-parallel rank (attention, dense MLP, embeddings)."""
    ep_rank: int = 0
    """Expert-parallel rank (which experts the rank owns)."""
    etp_rank: int = 0
    """Expert-tensor-parallel rank (which slice of each owned expert)."""
    pp_rank: int = 0
    """Pipeline rank (which layers the rank owns; no tensor mapping slices by it)."""

    def __post_init__(self) -> None:
        for name in ("tp_rank", "ep_rank", "etp_rank", "pp_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise MappingError(f"RankCoord.{name} must be a non-negative integer, got {value!r}")

    def check_in(self, layout: ParallelLayout) -> None:
        """Raise MappingError when a coordinate is outside `layout`."""
        for axis, size in (("tp", layout.tp), ("ep", layout.ep), ("etp", layout.etp), ("pp", layout.pp)):
            if getattr(self, f"{axis}_rank") >= size:
                raise MappingError(f"{self} is outside layout {layout.label}: {axis}_rank must be < {size}")
