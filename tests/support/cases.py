"""The one table of verify-matrix cases: every fixture at its layouts, each run once per test session by whichever test
asks first (`tests.support.helpers.matrix_run`, keyed by the case's gate id) and checked against its golden manifest."""

from __future__ import annotations

from convcheck.fixtures import FIXTURES, KNOWN_BUGS, PARTLY_COVERED, QUANT_FIXTURES, RELEASE_VARIANTS
from convcheck.gate.case import Case
from convcheck.layout import ParallelLayout

DENSE_LAYOUTS = [(), ("--tp", "2"), ("--pp", "2")]
MOE_LAYOUTS = [("--ep", "2"), ("--tp", "2", "--ep", "2")]
HYBRID_LAYOUTS = [(), ("--tp", "2"), ("--ep", "2")]
MOE = ("deepseek-v3", "glm4.7-flash", "moonlight", "qwen3-moe")
GDN = {  # gated-DeltaNet hybrids: the layouts that split their GDN heads, stages and experts (convcheck.gate.case)
    "qwen3-next": [("--tp", "2"), ("--pp", "2"), ("--tp", "2", "--ep", "2")],
    "qwen3.5": [("--tp", "2"), ("--pp", "2")],
    "qwen3.5-moe": [("--tp", "2", "--experts", "te-grouped"), ("--ep", "2", "--experts", "te-grouped")],
    "qwen3.6-moe": [("--ep", "2", "--experts", "te-grouped")],
}
TE = ("--experts", "te-grouped")
VPP = {  # 4- and 6-layer variants for the pipeline layouts their 2-layer fixtures cannot take (tests/test_vpp.py)
    "qwen2-tied-4l": [("--pp", "2", "--vpp", "2"), ("--pp", "2", "--pp-first", "1", "--pp-last", "3")],
    "llama-tied-4l": [("--pp", "2", "--vpp", "2"), ("--pp", "2", "--pp-first", "1", "--pp-last", "3")],
    "qwen3-moe-4l": [("--pp", "2", "--vpp", "2", "--ep", "2"), ("--pp", "2", "--vpp", "2", "--ep", "2", *TE)],
    "nemotron-h-6l": [("--pp", "2")],
}
PIPELINE_EXTRAS = [
    # the embedding and the loss counted as pipeline layers: chunk 0 of stage 0 and the last chunk of the last stage
    # build no decoder layer at all (2 layers over PP2 x VPP2 counted as 4)
    ("qwen2-tied", ("--pp", "2", "--vpp", "2", "--pp-embed", "--pp-loss")),
    # the 5-layer hybrid pattern M*-ME split 2 + 3 (an even PP2 cannot split it)
    ("nemotron-h", ("--pp", "2", "--pp-first", "2", "--pp-last", "3")),
]
TE_MATRIX = [  # the Transformer Engine layout verify builds by default (convcheck.gate.case TE_CASES)
    (name, (*layout, "--spec", "te", "--experts", "auto"))
    for name, layout in [
        ("qwen3", ("--tp", "2")),
        ("qwen3-moe", ("--tp", "2", "--ep", "2")),
        ("llama", ("--pp", "2")),
        ("gemma3", ("--tp", "2")),  # TE-only families (convcheck.models.te_only): one layout each
        ("minimax-m2", ("--tp", "2", "--ep", "2")),
        ("glm5", ("--tp", "2")),  # MLA + DSA with sequence parallelism; TP1 / EP2 in docs/families.md
    ]
]
TE_ONLY = ("gemma3", "minimax-m2", "glm5")
"""Fixtures of the families whose bridge spec exists only on TE: gated in TE_MATRIX only."""
FIXED = {  # families checked at a fixed list of layouts (convcheck.gate.case LAYOUTS_BY_FIXTURE and EXTRA_CASES)
    **GDN,
    "mistral-nowindow": [("--tp", "2")],  # the other layouts are tiny:mistral's
    # grouped experts only: the pinned bridge maps no SequentialMLP experts (tests/test_olmoe.py)
    "olmoe": [(*layout, *TE) for layout in [(), ("--tp", "2"), ("--pp", "2"), *MOE_LAYOUTS]],
    "gpt-oss": [*DENSE_LAYOUTS, *MOE_LAYOUTS, ("--ep", "2", *TE)],
    "gpt-oss-square": [("--ep", "2", *TE), ("--tp", "2", "--ep", "2", *TE)],
    "gpt-oss-2f-hidden": [("--ep", "2")],
    # grouped experts: the bridge maps no SequentialMLP experts (a named crash, tests/test_glm45.py)
    "glm4.5": [(*layout, *TE) for layout in [("--tp", "2"), ("--pp", "2"), *MOE_LAYOUTS]],
    "glm4.5-air": [("--tp", "2", "--ep", "2", *TE)],
    "kimi-k2": [("--tp", "2", "--ep", "2")],  # DeepSeek-V3's structure: its other layouts are tiny:deepseek-v3's
    # TE-only (the bridge's TE specs, convcheck.gate.case TE_CASES); TP1 / PP2 recorded in docs/families.md
    "qwen3-vl": [("--tp", "2", "--spec", "te", "--experts", "auto")],
    "qwen3-vl-moe": [("--ep", "2", "--spec", "te", "--experts", "auto")],
    # one case for both Qwen3.5-VL fixtures: GDN, attention, vision and experts split at once (tests/test_qwen35_vl.py);
    # the dense fixture's TP1 / TP2 / PP2 and the MoE's other layouts recorded in docs/families.md
    "qwen3.5-vl": [],
    "qwen3.5-vl-moe": [("--tp", "2", "--ep", "2", "--spec", "te", "--experts", "auto")],
    # Gemma 3 VL: the projector split over TP, the tower whole (tests/test_gemma3_vl.py); TP1 / PP2 in docs/families.md
    "gemma3-vl": [("--tp", "2", "--spec", "te", "--experts", "auto")],
    # the dense provider builds its own local spec whatever --spec says; PP2 is refused (docs/families.md)
    "gemma4": [("--tp", "2", "--spec", "te", "--experts", "auto")],
    # the MoE provider's TE spec; TP1 / TP2 / EP2 / PP2 recorded in docs/families.md
    "gemma4-moe": [("--tp", "2", "--ep", "2", "--spec", "te", "--experts", "auto")],
    # the dense provider's own spec, as tiny:gemma4's case; TP1 / PP2 recorded in docs/families.md
    "gemma4-vl": [("--tp", "2", "--spec", "te", "--experts", "auto")],
    # no case: its layouts' verdicts (three named bugs) are recorded in docs/families.md, its towers are gemma4-vl's
    "gemma4-vl-moe": [],
    # the bridge maps the MTP layers' norms only as TE's fused ones (nemotronh-mtp-norm-unmapped on the local spec);
    # TP1 / EP2 / PP2 / TP2xEP2 recorded in docs/families.md
    "nemotron-3-mtp": [("--tp", "2", "--spec", "te", "--experts", "auto")],
    **VPP,
}
DENSE = [
    name
    for name in sorted(FIXTURES)
    if name not in ("nemotron-h", *FIXED, *TE_ONLY, *PARTLY_COVERED, *RELEASE_VARIANTS, *QUANT_FIXTURES)
]
CASES = (
    [(name, layout) for name in DENSE for layout in DENSE_LAYOUTS]
    + [(name, layout) for name in MOE for layout in MOE_LAYOUTS]
    + [("nemotron-h", layout) for layout in HYBRID_LAYOUTS]
    + [(name, layout) for name, layouts in FIXED.items() if name not in PARTLY_COVERED for layout in layouts]
    + [("qwen2", ("--tp", "4"))]  # fewer KV heads (2) than TP ranks (4): each query group split over two ranks
    + PIPELINE_EXTRAS
    + TE_MATRIX
)
PASSING = [(name, layout) for name, layout in CASES if name not in KNOWN_BUGS]
"""The cases that must pass every oracle (exact verdicts of the others: tests/test_deepseek.py, test_qwen_next.py)."""
PADDED = ("qwen3", ("--tp", "2", "--pad-vocab", "128"))
"""The padded vocabulary training uses (make_vocab_size_divisible_by=128 x TP2): megatron-bridge 0.6.2 fails it."""


def layout_args(layout: tuple[str, ...]) -> dict[str, str | bool]:
    """A matrix layout's options: `--flag VALUE` pairs, and flags without a value (`--pp-embed`) as True."""
    out: dict[str, str | bool] = {}
    for i, arg in enumerate(layout):
        if arg.startswith("--"):
            value = layout[i + 1] if i + 1 < len(layout) and not layout[i + 1].startswith("--") else True
            out[arg] = value
    return out


def _size(value: str | bool) -> int | bool:
    return value if isinstance(value, bool) else int(value)


def gate_case(name: str, layout: tuple[str, ...]) -> Case:
    """The gate case of one matrix entry (its golden manifest is GOLDEN_DIR / case.file_name)."""
    args = layout_args(layout)
    pad = args.pop("--pad-vocab", None)
    experts = str(args.pop("--experts", "sequential"))
    spec = str(args.pop("--spec", "local"))
    grid = ParallelLayout(**{k.removeprefix("--").replace("-", "_"): _size(v) for k, v in args.items()})
    return Case(model=f"tiny:{name}", layout=grid, pad_vocab=int(pad) if pad else None, experts=experts, spec=spec)


def pinned(layout: tuple[str, ...]) -> tuple[str, ...]:
    """A matrix layout as its gate case runs it: the layer specs and expert layout named (the case's own, else the
    local spec with SequentialMLP experts its golden manifest was made with), not left to verify's defaults."""
    args = layout_args(layout)
    return (*layout, *(() if "--spec" in args else ("--spec", "local")),
            *(() if "--experts" in args else ("--experts", "sequential")))  # fmt: skip


def case_id(name: str, layout: tuple[str, ...]) -> str:
    """The gate id of tiny:NAME at `layout` (e.g. "qwen3/tp2"); KeyError when the table has no such case (another
    spelling of a layout in the table is the same case)."""
    wanted = gate_case(name, layout).id
    known = {gate_case(n, lay).id for n, lay in [*CASES, PADDED]}
    if wanted not in known:
        raise KeyError(f"no verify-matrix case {wanted} (tiny:{name} {' '.join(layout)}); known: {sorted(known)}")
    return wanted
