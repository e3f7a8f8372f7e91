"""The TE stand-in is faithful to Transformer Engine itself: read TE 2.20.2's own Python source out of its wheel (with
zipfile and ast, never imported: TE needs CUDA) and check that every parameter each TE module registers (name, shape
expressions, dtype argument) is what the stand-in declares, that the stand-in's modules register exactly those, and
that megatron-core's TE classes wrap the TE modules the stand-in follows.

The wheel is `transformer-engine-cu13==2.20.2` (277 MB): `make te-wheel` downloads it into $CONVCHECK_CACHE_DIR/te-wheel
(`pip download --no-deps`), or $CONVCHECK_TE_WHEEL names it; without it these tests skip, saying so."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.te_wheel import find_wheel, registered_parameters, te_bases, wheel_source

torch = pytest.importorskip("torch")

from convcheck.kernels.te import (  # noqa: E402 - after the torch skip
    STAND_INS,
    TE_VERSION,
    LayerNorm,
    RMSNorm,
    TEColumnParallelGroupedLinear,
    TEColumnParallelLinear,
    TEDotProductAttention,
    TELayerNormColumnParallelLinear,
    TELinear,
    TERowParallelLinear,
)

DECLARING = (TELinear, TELayerNormColumnParallelLinear, TEColumnParallelGroupedLinear, RMSNorm, LayerNorm,
             TEDotProductAttention)  # fmt: skip
"""The stand-in classes that declare a TE module's parameters (TE_SOURCE, TE_PARAMETERS); subclasses inherit them."""

WRAPS = {
    "TELinear": "te.pytorch.Linear",
    "TELayerNormColumnParallelLinear": "te.pytorch.LayerNormLinear",
    "TEDotProductAttention": "te.pytorch.DotProductAttention",
    "TEGroupedLinear": "te.pytorch.GroupedLinear",
}
"""megatron-core's TE class -> the TE module it subclasses (extensions/transformer_engine.py); TENorm picks
te.pytorch.LayerNorm or RMSNorm, TEColumn/RowParallel* subclass the classes above."""


@pytest.fixture(scope="module")
def wheel() -> Path:
    found = find_wheel(TE_VERSION)
    if found is None:
        pytest.skip(f"no transformer-engine-cu13 {TE_VERSION} wheel: `make te-wheel` downloads it (277 MB)")
    return found


@pytest.mark.parametrize("cls", DECLARING, ids=lambda c: c.__name__)
def test_te_registers_what_the_stand_in_declares(wheel: Path, cls: type) -> None:
    source = wheel_source(wheel, cls.TE_SOURCE.path)
    te = registered_parameters(source, cls.TE_SOURCE.cls)
    declared = [(r.name, r.shape, r.dtype) for r in cls.TE_PARAMETERS]
    assert te == declared, f"{cls.TE_SOURCE.path}::{cls.TE_SOURCE.cls} registers {te}"


def test_megatron_core_wraps_the_te_modules_the_stand_in_follows() -> None:
    spec = importlib.util.find_spec("megatron.core.extensions.transformer_engine")
    assert spec is not None and spec.origin
    bases = te_bases(Path(spec.origin).read_text())
    assert {name: bases[name] for name in WRAPS} == WRAPS
    assert bases["TEColumnParallelLinear"] == bases["TERowParallelLinear"] == "TELinear"
    assert bases["TEColumnParallelGroupedLinear"] == bases["TERowParallelGroupedLinear"] == "TEGroupedLinear"
    for name, te in WRAPS.items():
        follows = STAND_INS[name].TE_SOURCE.cls
        assert te.rsplit(".", 1)[1] == follows


def test_the_planted_defect_is_named(wheel: Path) -> None:
    """A stand-in declaring another parameter name or shape than TE would fail the comparison above."""
    te = registered_parameters(wheel_source(wheel, TELinear.TE_SOURCE.path), "Linear")
    assert te[0] == ("weight", ("out_features", "in_features"), "params_dtype")
    assert te != [("weight", ("in_features", "out_features"), "params_dtype"), te[1]]


def _config(**overrides):  # type: ignore[no-untyped-def]
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = dict(num_layers=2, hidden_size=16, num_attention_heads=4, num_query_groups=2, kv_channels=4,
                  ffn_hidden_size=24, use_cpu_initialization=True, params_dtype=torch.bfloat16,
                  perform_initialization=False, num_moe_experts=3, moe_ffn_hidden_size=10)  # fmt: skip
    return TransformerConfig(**{**fields, **overrides})


def _built() -> list[tuple[type, torch.nn.Module]]:
    """One instance of each declaring stand-in, with every optional parameter present."""
    from megatron.core.transformer.enums import AttnMaskType

    ln = _config(normalization="LayerNorm", add_bias_linear=True)
    linear = dict(init_method=None, gather_output=False, bias=True, skip_bias_add=False, is_expert=False)
    return [
        (TELinear, TEColumnParallelLinear(16, 24, config=ln, **linear)),
        (
            TELinear,
            TERowParallelLinear(
                24,
                16,
                config=ln,
                init_method=None,
                bias=True,
                input_is_parallel=True,
                skip_bias_add=False,
                is_expert=False,
            ),
        ),  # fmt: skip
        (TELayerNormColumnParallelLinear, TELayerNormColumnParallelLinear(16, 24, config=ln, **linear)),
        (
            TEColumnParallelGroupedLinear,
            TEColumnParallelGroupedLinear(
                3,
                16,
                20,
                config=ln,
                init_method=None,
                bias=True,
                skip_bias_add=False,
                is_expert=True,
                pg_collection=SimpleNamespace(expt_tp=None),
            ),
        ),  # fmt: skip
        (RMSNorm, RMSNorm(16, dtype=torch.bfloat16)),
        (LayerNorm, LayerNorm(16, dtype=torch.bfloat16)),
        (
            TEDotProductAttention,
            TEDotProductAttention(
                _config(softmax_type="learnable"),
                1,
                AttnMaskType.causal,
                "self",
                pg_collection=SimpleNamespace(tp=None),
            ),
        ),  # fmt: skip
    ]


def test_each_stand_in_registers_its_declared_parameters_with_their_shapes_and_dtypes() -> None:
    """Names in TE's order (`{i}` once per GEMM), shapes evaluated on the module's own attributes, the dtype of the
    argument TE reads (params_dtype / dtype: the config's; none: torch's default, fp32)."""
    for declaring, module in _built():
        gemms = getattr(module, "num_gemms", 1)
        if "{i}" in declaring.TE_PARAMETERS[0].name:
            expected = [(r, r.name.format(i=i)) for i in range(gemms) for r in declaring.TE_PARAMETERS]
        else:
            expected = [(r, r.name) for r in declaring.TE_PARAMETERS]
        got = list(module.named_parameters())
        assert [n for n, _ in got] == [n for _, n in expected], type(module).__name__
        for (rule, _), (name, param) in zip(expected, got):
            shape: list[int] = []
            for expr in rule.shape:
                names = {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)}
                value = eval(expr, {"__builtins__": {}}, {n: getattr(module, n) for n in names})
                shape += list(value) if isinstance(value, tuple) else [value]
            assert list(param.shape) == shape, f"{type(module).__name__}.{name}"
            dtype = torch.float32 if rule.dtype is None else torch.bfloat16
            assert param.dtype == dtype, f"{type(module).__name__}.{name}"
