"""ParallelLayout and RankCoord: how a (TP, PP, VPP, EP, ETP) layout, uneven pipeline stages included, and one rank's
place in it travel through convcheck."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from convcheck.errors import BadInput, MappingError
from convcheck.hf.geometry import Geometry

_LAYOUT_PART = re.compile(r"(etp|tp|vpp|pp|ep|first|last)(\d+)|(embed|loss)")
_SPELLED = {"first": "pp_first", "last": "pp_last", "embed": "pp_embed", "loss": "pp_loss"}
"""Spec words that are not the field's name: `pp4first1last3` is pp=4, pp_first=1, pp_last=3; `pp2embedloss` sets
pp_embed and pp_loss (flags: a word without a number)."""
_AXES = ("tp", "pp", "vpp", "pp_first", "pp_last", "pp_embed", "pp_loss", "ep", "etp")
"""Every field in spec order (pipeline fields together, so `tp2pp2vpp2ep2`)."""
_FLAGS = ("pp_embed", "pp_loss")


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
    vpp: int = 1
    """Virtual pipeline size: model chunks per pipeline rank, run interleaved (1: no virtual pipeline)."""
    pp_first: int | None = None
    """Decoder layers of the first pipeline stage (Megatron's num_layers_in_first_pipeline_stage; None: even)."""
    pp_last: int | None = None
    """Decoder layers of the last pipeline stage (num_layers_in_last_pipeline_stage; None: even); the stages between
    the first and the last share the remaining layers evenly."""
    pp_embed: bool = False
    """The embedding counts as one layer of the pipeline split: chunk 0 of the first stage builds one decoder layer
    fewer (Megatron's account_for_embedding_in_pipeline_split)."""
    pp_loss: bool = False
    """The loss counts as one layer of the split: the last chunk of the last stage builds one decoder layer fewer
    (account_for_loss_in_pipeline_split)."""

    def __post_init__(self) -> None:
        for field_name in _AXES:
            value = getattr(self, field_name)
            if field_name in _FLAGS:
                if not isinstance(value, bool):
                    raise BadInput(f"impossible layout: {field_name} must be true or false, got {value!r}")
                continue
            if value is None and field_name in ("pp_first", "pp_last"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                flag = "--" + field_name.replace("_", "-")
                raise BadInput(f"impossible layout: {flag} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        """Ranks needed: lcm of the dense grid (tp) and the expert grid (ep*etp), times pp."""
        return math.lcm(self.tp, self.ep * self.etp) * self.pp

    @property
    def uneven(self) -> bool:
        """Whether the first or the last pipeline stage has a layer count of its own."""
        return self.pp_first is not None or self.pp_last is not None

    @property
    def accounts(self) -> bool:
        """Whether the embedding or the loss counts as a layer of the pipeline split."""
        return self.pp_embed or self.pp_loss

    def fields_set(self) -> list[tuple[str, int | bool]]:
        """(field, value) of every field away from its default, in spec order (what a replay line spells out)."""
        values = [(name, getattr(self, name)) for name in _AXES]
        return [(k, v) for k, v in values if v not in (None, False) and (k in _SPELLED.values() or v > 1)]

    def _set(self) -> list[str]:
        """The spec word (with its number, flags without) of every field away from its default, in spec order."""
        words = {v: k for k, v in _SPELLED.items()}
        return [words.get(k, k) + ("" if k in _FLAGS else str(v)) for k, v in self.fields_set()]

    def cli_args(self) -> list[str]:
        """The `convcheck verify` options giving this layout (defaults left out), e.g. ["--pp", "2", "--vpp", "2"]."""
        args = []
        for key, value in self.fields_set():
            flag = f"--{key.replace('_', '-')}"
            args += [flag] if value is True else [flag, str(value)]
        return args

    @property
    def label(self) -> str:
        """Short human label such as "TP2xEP2", "PP2xVPP2", "PP2xFIRST1xLAST3", "PP2xEMBEDxLOSS" or "TP1"."""
        return "x".join(word.upper() for word in self._set()) or "TP1"

    @property
    def spec(self) -> str:
        """Compact spelling such as "tp2ep2", "pp2vpp2", "pp2first1last3", "pp2embedloss" or "tp1" (what `parse`
        reads back)."""
        return "".join(self._set()) or "tp1"

    @classmethod
    def parse(cls, text: str) -> "ParallelLayout":
        """Read "tp2ep2", "TP2xEP2", "pp2", "tp2-ep2-etp2", "pp2vpp2", "pp2first1last3" (axes default to 1, stages
        to even); BadInput on anything else."""
        cleaned = text.strip().lower().replace("x", "").replace("-", "").replace("_", "").replace(",", "")
        sizes: dict[str, int | bool] = {}
        for axis, value, flag in _LAYOUT_PART.findall(cleaned):
            if (axis or flag) in sizes:
                raise BadInput(f"layout {text!r} names {axis or flag} twice")
            sizes[axis or flag] = int(value) if axis else True
        if not cleaned or _LAYOUT_PART.sub("", cleaned):
            raise BadInput(f"layout {text!r} is not of the form tp2, tp2ep2, pp2, tp2ep2etp2, pp2vpp2, pp2first1last3")
        return cls(**{_SPELLED.get(k, k): v for k, v in sizes.items()})

    def to_dict(self) -> dict[str, int]:
        """Plain dict including the world size (for JSON reports); vpp, pp_first and pp_last only when set, so a
        layout without them reads as it always did."""
        data = {k: v for k, v in asdict(self).items() if k in ("tp", "pp", "ep", "etp")}
        data |= {k: v for k, v in self.fields_set() if k in ("vpp", "pp_first", "pp_last", *_FLAGS)}
        return {**data, "world_size": self.world_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ParallelLayout":
        """Inverse of to_dict (world_size is derived, so ignored)."""
        return cls(**{k: bool(data[k]) if k in _FLAGS else int(data[k]) for k in _AXES if data.get(k) is not None})

    def chunk_counts(self, num_layers: int) -> list[list[int]]:
        """[stage][chunk] -> how many decoder layers that model chunk builds; assumes `pipeline_problems` is empty.
        Even: num_layers / (pp * vpp) each; uneven: pp_first / pp_last per end stage, the middle stages sharing the
        rest; pp_embed / pp_loss: the embedding / loss counted as a layer, the first / last chunk building one fewer."""
        first, last = self.pp_first, self.pp_last
        counted = num_layers + self.pp_embed + self.pp_loss
        middle = self.pp - (first is not None) - (last is not None)
        rest = counted - (first or 0) - (last or 0)
        stages = [rest // middle if middle else 0] * self.pp
        if first is not None:
            stages[0] = first
        if last is not None:
            stages[-1] = last
        counts = [[n // self.vpp] * self.vpp for n in stages]
        counts[0][0] -= self.pp_embed
        counts[-1][-1] -= self.pp_loss
        return counts

    def chunk_layers(self, num_layers: int) -> list[list[range]]:
        """[stage][chunk] -> the global decoder layer numbers (0-based) of that model chunk, in Megatron's order:
        chunk 0 of every stage first, then chunk 1 of every stage, ..."""
        counts = self.chunk_counts(num_layers)
        out: list[list[range]] = [[] for _ in range(self.pp)]
        start = 0
        for chunk in range(self.vpp):
            for stage in range(self.pp):
                out[stage].append(range(start, start + counts[stage][chunk]))
                start += counts[stage][chunk]
        return out

    def pipeline_problems(self, layers: int) -> list[str]:
        """Every pipeline constraint (pp, vpp, uneven stages) this layout breaks for `layers` decoder layers."""
        out = []
        if self.vpp > 1 and self.pp < 2:
            out.append(f"vpp={self.vpp} needs pp > 1 (a virtual pipeline interleaves chunks over pipeline ranks)")
        if self.uneven and self.pp < 2:
            out.append("pp_first / pp_last need pp > 1 (they size the first and last pipeline stages)")
        if self.accounts and self.pp < 2:
            out.append("pp_embed / pp_loss need pp > 1 (they count the embedding / loss as a pipeline layer)")
        if self.accounts and self.uneven:  # megatron-core 0.19.2 transformer_block.py:102
            out.append("pp_embed / pp_loss cannot be combined with pp_first / pp_last")
        if out or not layers:
            return out
        if not self.uneven:
            counted = layers + self.pp_embed + self.pp_loss
            if counted % (self.pp * self.vpp):
                what = f"pp={self.pp}" if self.vpp == 1 else f"pp*vpp={self.pp}*{self.vpp}"
                extra = "".join(f" + the {n}" for n, on in (("embedding", self.pp_embed), ("loss", self.pp_loss)) if on)
                whole = f"num_hidden_layers={layers}{extra}" + (f" = {counted}" if extra else "")
                out.append(f"{what} does not divide {whole}")
            return out
        ends = [(n, v) for n, v in (("pp_first", self.pp_first), ("pp_last", self.pp_last)) if v is not None]
        for name, value in ends:
            if value % self.vpp:
                out.append(f"vpp={self.vpp} does not divide {name}={value}")
        middle = self.pp - len(ends)
        rest = layers - sum(v for _, v in ends)
        named = " + ".join(f"{n}={v}" for n, v in ends)
        if rest < 0 or (not middle and rest):
            out.append(f"{named} does not add up to num_hidden_layers={layers} over pp={self.pp} stages")
        elif middle and not rest:
            out.append(f"{named} leaves no layers for the {middle} middle stage(s) of pp={self.pp}")
        elif middle and rest % (middle * self.vpp):
            each = f"{middle}" if self.vpp == 1 else f"{middle}*vpp={middle * self.vpp}"
            out.append(f"the {rest} layers left by {named} do not split evenly over {each} middle stage chunk(s)")
        return out

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
        out += self.pipeline_problems(layers)
        if self.vpp > 1 and geometry.layer_types:  # megatron-core 0.19.2 hybrid_layer_allocation.py:385
            out.append(f"vpp={self.vpp} needs '|' stage separators in a hybrid layer pattern (convcheck has none)")
        if self.accounts and geometry.layer_types:  # hybrid_layer_allocation.py:331 splits by first / last only
            out.append("pp_embed / pp_loss are not applied to a hybrid layer pattern by megatron-core")
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
        if all(type(v) is int and v >= 0 for v in (self.tp_rank, self.ep_rank, self.etp_rank, self.pp_rank)):
            return  # the common case, without naming each axis
        for name in ("tp_rank", "ep_rank", "etp_rank", "pp_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise MappingError(f"RankCoord.{name} must be a non-negative integer, got {value!r}")

    def check_in(self, layout: ParallelLayout) -> None:
        """Raise MappingError when a coordinate is outside `layout`."""
        inside = self.tp_rank < layout.tp and self.ep_rank < layout.ep and self.etp_rank < layout.etp
        if inside and self.pp_rank < layout.pp:
            return  # every check of a shard asks: the common answer without building the pairs
        for axis, size in (("tp", layout.tp), ("ep", layout.ep), ("etp", layout.etp), ("pp", layout.pp)):
            if getattr(self, f"{axis}_rank") >= size:
                raise MappingError(f"{self} is outside layout {layout.label}: {axis}_rank must be < {size}")
