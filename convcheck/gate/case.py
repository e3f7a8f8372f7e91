"""One gate case (model, layout, padded vocabulary) and the default matrix of convcheck's own fixtures."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from convcheck.errors import BadInput
from convcheck.fixtures import FIXTURES, PARTLY_COVERED, QUANT_FIXTURES, RELEASE_VARIANTS, get_spec
from convcheck.layout import ParallelLayout

STANDARD_LAYOUTS = ("tp1", "tp2", "pp2", "ep2", "tp2ep2")
"""Layouts every fixture is gated at where `ParallelLayout.validate_for` allows them."""
LAYOUTS_BY_FIXTURE = {
    "nemotron-h": ("tp1", "tp2", "ep2"),
    "qwen3-next": ("tp2", "pp2", "tp2ep2"),
    "qwen3.5": ("tp2", "pp2"),
    "qwen3.5-moe": (),
    "qwen3.6-moe": (),
    "mistral-nowindow": ("tp2",),
    "olmoe": (),
    "gpt-oss-square": (),
    "gpt-oss-2f-hidden": ("ep2",),
    "glm4.5": (),
    "glm4.5-air": (),
    "qwen2-tied-4l": ("pp2vpp2", "pp2first1last3"),
    "llama-tied-4l": ("pp2vpp2", "pp2first1last3"),
    "qwen3-moe-4l": ("pp2vpp2ep2",),
    "nemotron-h-6l": ("pp2",),
    "kimi-k2": ("tp2ep2",),
    "glm5": (),
    "gemma3": (),
    "minimax-m2": (),
    "qwen3-vl": (),
    "qwen3-vl-moe": (),
    "qwen3.5-vl": (),
    "qwen3.5-vl-moe": (),
    "gemma4": (),
    "gemma4-moe": (),
    "gemma4-vl": (),
    "gemma4-vl-moe": (),
    "gemma3-vl": (),
    "nemotron-3-mtp": (),
}
"""Fixtures gated at a fixed list instead (the 4-layer / 6-layer pipeline fixtures at their virtual and uneven
pipeline layouts; NemotronH: 5 layers, no even PP2; TP2xEP2 is not part of its matrix; the
gated-DeltaNet fixtures at the layouts that split their GDN heads, stages and experts; Qwen3.5-MoE and Qwen3.6-MoE
only with the TEGroupedMLP layout, EXTRA_CASES: the pinned bridge cannot load their SequentialMLP MTP experts; Mistral
without a window at TP2 only, tiny:mistral covering the layouts; Kimi-K2 at TP2xEP2 only, tiny:deepseek-v3 and
tiny:moonlight covering the MLA layouts; Qwen3-VL, Qwen3-VL-MoE, Qwen3.5-VL-MoE, Gemma 4 VL, GLM-5 and Nemotron-3
with MTP only in TE_CASES, Qwen3.5-VL (dense) and Gemma 4 VL MoE in none, the TE-only families' layer specs, their
other layouts' verdicts recorded in docs/families.md)."""
EXTRA_CASES = (
    ("tiny:qwen2", "tp4", None, "sequential"),
    ("tiny:qwen3", "tp2", 128, "sequential"),
    ("tiny:qwen3.5-moe", "tp2", None, "te-grouped"),
    ("tiny:qwen3.5-moe", "ep2", None, "te-grouped"),
    ("tiny:qwen3.6-moe", "ep2", None, "te-grouped"),
    *(("tiny:olmoe", layout, None, "te-grouped") for layout in ("tp1", "tp2", "pp2", "ep2", "tp2ep2")),
    ("tiny:gpt-oss", "ep2", None, "te-grouped"),
    ("tiny:gpt-oss-square", "ep2", None, "te-grouped"),
    ("tiny:gpt-oss-square", "tp2ep2", None, "te-grouped"),
    *(("tiny:glm4.5", layout, None, "te-grouped") for layout in ("tp2", "pp2", "ep2", "tp2ep2")),
    ("tiny:glm4.5-air", "tp2ep2", None, "te-grouped"),
    ("tiny:qwen3-moe-4l", "pp2vpp2ep2", None, "te-grouped"),
    ("tiny:qwen2-tied", "pp2vpp2embedloss", None, "sequential"),
    ("tiny:nemotron-h", "pp2first2last3", None, "sequential"),
)
"""Beyond the standard layouts: fewer KV heads than TP ranks, the padded vocabulary training uses, and Qwen3.5-MoE with
the TEGroupedMLP layout GPU training runs (the bridge maps its MTP experts only there), and OLMoE in that layout too
(the bridge maps its experts only there), GPT-OSS's square fixture and GLM-4.5 (whose bridge maps no SequentialMLP
experts: tests/test_glm45.py runs that named crash) with TEGroupedMLP experts; the virtual pipeline with the embedding
and loss counted as stages (two chunks hold no decoder layer), and NemotronH's hybrid pattern split 2 + 3 over PP2."""


TE_CASES = (
    ("tiny:qwen3", "tp2"),
    ("tiny:qwen3-moe", "tp2ep2"),
    ("tiny:llama", "pp2"),
    ("tiny:gemma3", "tp2"),
    ("tiny:minimax-m2", "tp2ep2"),
    ("tiny:glm5", "tp2"),
    ("tiny:qwen3-vl", "tp2"),
    ("tiny:qwen3-vl-moe", "ep2"),
    ("tiny:qwen3.5-vl-moe", "tp2ep2"),
    ("tiny:gemma4", "tp2"),
    ("tiny:gemma4-moe", "tp2ep2"),
    ("tiny:gemma4-vl", "tp2"),
    ("tiny:nemotron-3-mtp", "tp2"),
    ("tiny:gemma3-vl", "tp2"),
)
"""The Transformer Engine layout `verify` builds by default (the bridge's TE specs, TE-fused norms, experts as the
provider asks: TEGroupedMLP for Qwen3-MoE), at a tensor-, an expert- and a pipeline-parallel layout, and the families
whose bridge spec exists only on TE (convcheck.models.te_only) at one layout each (Gemma 3 at TP2, MiniMax-M2 at
TP2xEP2, Qwen3-VL at TP2, Qwen3-VL-MoE at EP2, Qwen3.5-VL-MoE at TP2xEP2 (Qwen3.5-VL's one case), GLM-5 at TP2
with its sequence parallelism, Gemma 4 at TP2, whose dense provider builds its own local spec either way, Gemma 4
MoE at TP2xEP2 and Gemma 4 VL at TP2 (the dense provider's own spec); their other layouts are recorded in
docs/gate.md and docs/families.md), Nemotron-3 with MTP at TP2 (the bridge maps its MTP layers' norms only as
TE's fused ones: the local spec fails on the named bug nemotronh-mtp-norm-unmapped, its other layouts in
docs/families.md), and Gemma 3 VL at TP2 (its language model the Gemma 3 TE spec, its projector split over TP;
TP1 / PP2 in docs/families.md); every other case pins megatron-core's local spec its golden manifest was made
with."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One verify launch of the gate: a model (tiny:NAME or a folder) at one layout."""

    model: str
    layout: ParallelLayout
    pad_vocab: int | None = None
    experts: str = "sequential"
    spec: str = "local"
    """Layer specs the case builds ("local": megatron-core's local spec; "te": the bridge's TE specs)."""

    @property
    def id(self) -> str:
        """`qwen3/tp2`, `qwen3/tp2+pad128`, `qwen3-moe/ep2+te-grouped`: stable across releases."""
        name = self.model.removeprefix("tiny:") if self.model.startswith("tiny:") else _folder_label(self.model)
        extra = (
            (f"+pad{self.pad_vocab}" if self.pad_vocab else "")
            + (f"+{self.experts}" if self.experts not in ("sequential", "auto") else "")
            + (f"+{self.spec}" if self.spec != "local" else "")
        )
        return f"{name}/{self.layout.spec}{extra}"

    @property
    def file_name(self) -> str:
        """The manifest's file name inside a gate folder."""
        return self.id.replace("/", "__").replace("+", "_") + ".json"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "layout": self.layout.spec,
            "pad_vocab": self.pad_vocab,
            "experts": self.experts,
            **({"spec": self.spec} if self.spec != "local" else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Case":
        return cls(
            model=str(data["model"]),
            layout=ParallelLayout.parse(str(data["layout"])),
            pad_vocab=data.get("pad_vocab"),
            experts=str(data.get("experts", "sequential")),
            spec=str(data.get("spec", "local")),
        )


def _folder_label(path: str) -> str:
    """The last part of a checkpoint folder, safe in a file name."""
    tail = path.rstrip("/").rpartition("/")[2] or "model"
    return re.sub(r"[^A-Za-z0-9._-]", "_", tail)


def fixture_layouts(model: str) -> tuple[str, ...]:
    """The layouts a fixture is gated at by default (its legal standard layouts, or its fixed list)."""
    spec = get_spec(model)
    wanted = LAYOUTS_BY_FIXTURE.get(spec.name, STANDARD_LAYOUTS)
    out = []
    for text in wanted:
        try:
            ParallelLayout.parse(text).validate_for(spec.config)
        except BadInput:
            continue
        out.append(text)
    return tuple(out)


def default_matrix() -> list[Case]:
    """Every fixture but the release variants, the quant fixtures and the partly covered families at its layouts,
    then the extra cases (what `gate record` records with no selection)."""
    cases = [
        Case(model=f"tiny:{name}", layout=ParallelLayout.parse(layout))
        for name in sorted(FIXTURES)
        if name not in (*RELEASE_VARIANTS, *PARTLY_COVERED, *QUANT_FIXTURES)
        for layout in fixture_layouts(name)
    ]
    cases += [
        Case(model=m, layout=ParallelLayout.parse(lay), pad_vocab=pad, experts=experts)
        for m, lay, pad, experts in EXTRA_CASES
        if m.removeprefix("tiny:") not in PARTLY_COVERED
    ]
    cases += [Case(model=m, layout=ParallelLayout.parse(lay), experts="auto", spec="te") for m, lay in TE_CASES]
    return cases


def normalise_model(model: str) -> str:
    """`qwen3` and `tiny:qwen3` name the same fixture; anything else is a checkpoint folder, kept as given."""
    return f"tiny:{model}" if model in FIXTURES else model


def select(
    cases: list[Case],
    *,
    models: tuple[str, ...] = (),
    layouts: tuple[str, ...] = (),
    ids: tuple[str, ...] = (),
) -> list[Case]:
    """The cases matching every given filter (model label, layout with its variant, case id); BadInput when none does.

    `--layout tp2` selects the plain TP2 cases; `tp2+pad128` the padded one (as its case id spells it)."""
    wanted_models = {normalise_model(m) for m in models}
    wanted_layouts = {_layout_key(text) for text in layouts}
    unknown = sorted(set(ids) - {c.id for c in cases})
    if unknown:
        raise BadInput(f"unknown gate case {unknown[0]!r}; known: {', '.join(c.id for c in cases)}")
    out = [
        c
        for c in cases
        if (not wanted_models or c.model in wanted_models)
        and (not wanted_layouts or c.id.partition("/")[2] in wanted_layouts)
        and (not ids or c.id in ids)
    ]
    if not out:
        shown = ", ".join([*models, *layouts, *ids])
        raise BadInput(f"no gate case matches {shown}; known: {', '.join(c.id for c in cases)}")
    return out


def _layout_key(text: str) -> str:
    """`TP2` -> `tp2`, `tp2+pad128` -> `tp2+pad128`: a layout names the unpadded case unless its variant is given."""
    layout, plus, variant = text.partition("+")
    return ParallelLayout.parse(layout).spec + plus + variant
