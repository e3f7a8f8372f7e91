"""The Transformer Engine stand-in without ranks (convcheck.kernels.te, `verify --spec te`): each module's parameters
(names in order, shapes, dtypes, parallel attributes) and forward against a plain-torch reference, and shim 26's
still-needed test. Run end to end, through the real bridge, in tests/test_te_standin_ranks.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from convcheck import compat
from convcheck.compare.bits import bytes_equal
from convcheck.errors import BadInput
from tests.support.release_targets import skip_unless, upstream_object

torch = pytest.importorskip("torch")
F = torch.nn.functional

from convcheck.kernels.te import (  # noqa: E402 - after the torch skip
    STAND_INS,
    TEColumnParallelGroupedLinear,
    TEColumnParallelLinear,
    TEDotProductAttention,
    TELayerNormColumnParallelLinear,
    TELinear,
    TENorm,
    TERowParallelGroupedLinear,
    TERowParallelLinear,
)
from convcheck.kernels.te.attention import window_mask  # noqa: E402

HIDDEN, HEADS, GROUPS, HEAD_DIM = 16, 4, 2, 4


def _config(**overrides):  # type: ignore[no-untyped-def]
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = dict(num_layers=2, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
                  kv_channels=HEAD_DIM, ffn_hidden_size=24, use_cpu_initialization=True, params_dtype=torch.float32,
                  normalization="RMSNorm", layernorm_epsilon=1e-6, perform_initialization=False)  # fmt: skip
    return TransformerConfig(**{**fields, **overrides})


def _fill(module: torch.nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen).to(p.dtype))


def _names(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    return [(n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()]


def _x(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_shim26_still_needed_te_layer_spec_has_no_backend_without_te() -> None:
    """Fails once megatron-core builds its TE layer spec without Transformer Engine (then delete shim 26)."""
    compat.install_import_shims()
    specs = upstream_object("megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_with_transformer_engine_spec")
    skip_unless(not compat.transformer_engine_available(), "a missing Transformer Engine")
    from megatron.core.models.gpt import gpt_layer_specs

    assert not compat.te_standin_installed()  # shim 26 is bound only inside a --spec te rank
    assert gpt_layer_specs.TESpecProvider is None
    with pytest.raises(TypeError, match="'NoneType' object is not callable"):
        specs(num_experts=None, qk_layernorm=True)


def test_every_te_class_the_spec_provider_names_has_a_stand_in() -> None:
    """Every TE class TESpecProvider takes from megatron-core's TE extension is stood in for, under its name (but the
    activation op, which only use_te_activation_func asks for)."""
    from megatron.core.extensions import transformer_engine as extension
    from megatron.core.extensions import transformer_engine_spec_provider as provider

    from_extension = {n for n in vars(provider) if n.startswith("TE") and vars(extension).get(n, provider) is
                      vars(provider)[n]}  # fmt: skip
    assert from_extension - {"TEActivationOp"} == set(STAND_INS) - {"TEGroupedLinear"}
    assert {cls.__name__ for cls in STAND_INS.values()} == set(STAND_INS)


def test_column_linear_holds_its_rows_and_computes_x_wt_plus_b() -> None:
    config = _config(params_dtype=torch.bfloat16)
    fc = TEColumnParallelLinear(HIDDEN, 24, config=config, init_method=None, gather_output=False, bias=True,
                                skip_bias_add=False, is_expert=False)  # fmt: skip
    assert _names(fc) == [("weight", (24, HIDDEN), torch.bfloat16), ("bias", (24,), torch.bfloat16)]
    assert (fc.weight.tensor_model_parallel, fc.weight.partition_dim, fc.weight.partition_stride) == (True, 0, 1)
    assert (fc.bias.tensor_model_parallel, fc.bias.partition_dim, fc.weight.allreduce) == (True, 0, True)
    fc32 = TEColumnParallelLinear(HIDDEN, 24, config=_config(), init_method=None, gather_output=False, bias=True,
                                  skip_bias_add=False, is_expert=False)  # fmt: skip
    _fill(fc32)
    x = _x(3, 2, HIDDEN)
    out, bias = fc32(x)
    assert bias is None and torch.allclose(out, x @ fc32.weight.T + fc32.bias, atol=1e-6)


def test_row_linear_returns_its_whole_bias_unapplied_with_skip_bias_add() -> None:
    row = TERowParallelLinear(24, HIDDEN, config=_config(), init_method=None, bias=True, input_is_parallel=True,
                              skip_bias_add=True, is_expert=False)  # fmt: skip
    assert _names(row) == [("weight", (HIDDEN, 24), torch.float32), ("bias", (HIDDEN,), torch.float32)]
    assert row.weight.partition_dim == 1 and not hasattr(row.bias, "tensor_model_parallel")
    _fill(row)
    x = _x(3, 2, 24)
    out, bias = row(x)
    assert torch.allclose(out, x @ row.weight.T, atol=1e-6) and bytes_equal(row.bias, bias)


def test_linear_without_bias_holds_te_empty_bias_and_duplicated_is_not_tp() -> None:
    dup = TELinear(HIDDEN, 8, parallel_mode="duplicated", config=_config(), init_method=None, bias=False,
                   skip_bias_add=False, skip_weight_param_allocation=False)  # fmt: skip
    assert _names(dup) == [("weight", (8, HIDDEN), torch.float32)]
    assert dup.bias.numel() == 0 and not isinstance(dup.bias, torch.nn.Parameter)
    assert dup.weight.tensor_model_parallel is False and dup.parallel_mode is None


@pytest.mark.parametrize("normalization", ["RMSNorm", "LayerNorm"])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_layernorm_linear_norms_its_input_then_projects(normalization: str, zero_centered: bool) -> None:
    config = _config(normalization=normalization, layernorm_zero_centered_gamma=zero_centered)
    qkv = TELayerNormColumnParallelLinear(HIDDEN, 32, config=config, init_method=None, gather_output=False,
                                          bias=False, skip_bias_add=False, is_expert=False)  # fmt: skip
    names = [n for n, _, _ in _names(qkv)]
    assert names == ["layer_norm_weight", *(["layer_norm_bias"] if normalization == "LayerNorm" else []), "weight"]
    init = 0.0 if zero_centered else 1.0
    assert bytes_equal(torch.full((HIDDEN,), init), qkv.layer_norm_weight)
    assert not hasattr(qkv.layer_norm_weight, "tensor_model_parallel") and qkv.weight.partition_dim == 0
    _fill(qkv)
    x = _x(5, 2, HIDDEN)
    gamma = qkv.layer_norm_weight + (1.0 if zero_centered else 0.0)
    if normalization == "RMSNorm":
        normed = F.rms_norm(x, (HIDDEN,), gamma, eps=1e-6)
    else:
        normed = F.layer_norm(x, (HIDDEN,), gamma, qkv.layer_norm_bias, eps=1e-6)
    out, bias = qkv(x)
    assert bias is None and torch.allclose(out, normed @ qkv.weight.T, atol=1e-5)


def test_te_norm_picks_te_classes_by_normalization() -> None:
    rms = TENorm(_config(params_dtype=torch.bfloat16), HIDDEN, eps=1e-6)
    assert type(rms).__name__ == "RMSNorm" and _names(rms) == [("weight", (HIDDEN,), torch.bfloat16)]
    ln = TENorm(_config(normalization="LayerNorm", layernorm_zero_centered_gamma=True), HIDDEN)
    assert type(ln).__name__ == "LayerNorm" and [n for n, *_ in _names(ln)] == ["weight", "bias"]
    assert bytes_equal(torch.zeros(HIDDEN), ln.weight)  # zero-centered gamma starts at 0 (scale 1)
    _fill(ln)
    x = _x(4, HIDDEN)
    assert torch.allclose(ln(x), F.layer_norm(x, (HIDDEN,), ln.weight + 1, ln.bias, eps=1e-5), atol=1e-5)
    with pytest.raises(NotImplementedError, match="fused residual"):
        TENorm(_config(fused_residual_rmsnorm=True), HIDDEN, has_residual=True)


def _attention(softmax_scale: float | None = None, **overrides):  # type: ignore[no-untyped-def]
    from megatron.core.transformer.enums import AttnMaskType

    config = _config(**overrides)
    attn = TEDotProductAttention(config, 1, AttnMaskType.causal, "self", softmax_scale=softmax_scale,
                                 pg_collection=SimpleNamespace(tp=None))  # fmt: skip
    return attn.eval()  # attention dropout (0.1 by default) only while training


def _reference(q, k, v, allowed, scale, sink=None):  # type: ignore[no-untyped-def]
    """Softmax attention spelled out: q [s, b, h, d], k/v [s, b, g, d], allowed [sq, sk] bool."""
    sq, b, h, _ = q.shape
    out = torch.zeros(sq, b, h, v.shape[-1])
    for head in range(h):
        g = head // (h // k.shape[2])
        for i in range(sq):
            logits = [(q[i, :, head] * k[j, :, g]).sum(-1) * scale for j in range(k.shape[0]) if allowed[i, j]]
            js = [j for j in range(k.shape[0]) if allowed[i, j]]
            stacked = torch.stack(logits, dim=-1)  # [b, keys]
            denom = stacked.exp().sum(-1) + (math.exp(sink[head]) if sink is not None else 0.0)
            weights = stacked.exp() / denom.unsqueeze(-1)
            out[i, :, head] = sum(weights[:, n : n + 1] * v[j, :, g] for n, j in enumerate(js))
    return out.reshape(sq, b, h * v.shape[-1])


def _qkv(sq: int = 6):  # type: ignore[no-untyped-def]
    return _x(sq, 2, HEADS, HEAD_DIM, seed=2), _x(sq, 2, GROUPS, HEAD_DIM, seed=3), _x(sq, 2, GROUPS, HEAD_DIM, seed=4)


def test_attention_is_causal_gqa_with_the_default_scale() -> None:
    from megatron.core.transformer.enums import AttnMaskType

    attn = _attention()
    assert attn.softmax_offset is None and list(attn.parameters()) == []
    q, k, v = _qkv()
    out = attn(q, k, v, None, AttnMaskType.causal)
    expected = _reference(q, k, v, torch.ones(6, 6).tril().bool(), 1 / math.sqrt(HEAD_DIM))
    assert out.shape == (6, 2, HEADS * HEAD_DIM) and torch.allclose(out, expected, atol=1e-5)


def test_attention_on_packed_sequences_attends_within_each() -> None:
    """THD (the Qwen3-VL vision tower's images): query / key / value [t, heads, d], each sequence of cu_seqlens
    attending only within itself (no_mask), output [t, heads x d]."""
    from megatron.core.transformer.enums import AttnMaskType

    attn = _attention()
    q, k, v = _qkv(7)
    q, k, v = q[:, 0], k[:, 0], v[:, 0]  # [t, h, d]: one packed batch of sequences of 3 and 4 tokens
    packed = SimpleNamespace(
        qkv_format="thd", cu_seqlens_q=torch.tensor([0, 3, 7]), cu_seqlens_kv=torch.tensor([0, 3, 7])
    )
    out = attn(q, k, v, None, AttnMaskType.no_mask, packed_seq_params=packed)
    allowed = torch.zeros(7, 7, dtype=torch.bool)
    allowed[:3, :3] = allowed[3:, 3:] = True
    expected = _reference(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), allowed, 1 / math.sqrt(HEAD_DIM))
    assert out.shape == (7, HEADS * HEAD_DIM) and torch.allclose(out, expected.squeeze(1), atol=1e-5)


def test_attention_window_sees_the_last_left_plus_one_keys() -> None:
    from megatron.core.transformer.enums import AttnMaskType

    assert window_mask(4, 4, (1, 0), "causal").tolist() == [
        [False, True, True, True], [False, False, True, True], [True, False, False, True], [True, True, False, False]
    ]  # fmt: skip
    attn = _attention(window_size=(2, 0), softmax_scale=0.3)
    q, k, v = _qkv()
    allowed = torch.tensor([[0 <= i - j <= 2 for j in range(6)] for i in range(6)])
    out = attn(q, k, v, None, AttnMaskType.causal)
    assert torch.allclose(out, _reference(q, k, v, allowed, 0.3), atol=1e-5)


def test_learnable_sinks_join_the_softmax_denominator_per_head() -> None:
    from megatron.core.transformer.enums import AttnMaskType

    attn = _attention(softmax_type="learnable", params_dtype=torch.bfloat16)
    assert _names(attn) == [("softmax_offset", (HEADS,), torch.float32)]  # TE allocates it in the default dtype
    with torch.no_grad():
        attn.softmax_offset.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    q, k, v = _qkv()
    out = attn(q, k, v, None, AttnMaskType.causal)
    expected = _reference(q, k, v, torch.ones(6, 6).tril().bool(), 1 / math.sqrt(HEAD_DIM),
                          sink=attn.softmax_offset.tolist())  # fmt: skip
    assert torch.allclose(out, expected, atol=1e-5)


def _grouped(cls, bias: bool, skip_bias_add: bool, out_size: int = 10):  # type: ignore[no-untyped-def]
    config = _config(num_moe_experts=3, add_bias_linear=bias, moe_ffn_hidden_size=10)
    return cls(3, HIDDEN, out_size, config=config, init_method=None, bias=bias, skip_bias_add=skip_bias_add,
               is_expert=True, pg_collection=SimpleNamespace(expt_tp=None))  # fmt: skip


def test_grouped_linear_runs_each_experts_rows_through_its_weight() -> None:
    fc1 = _grouped(TEColumnParallelGroupedLinear, bias=True, skip_bias_add=False)
    assert [n for n, *_ in _names(fc1)] == ["weight0", "bias0", "weight1", "bias1", "weight2", "bias2"]
    assert fc1.weight2.shape == (10, HIDDEN) and fc1.bias1.partition_dim == 0
    assert fc1.weight0.allreduce is True  # EP1 with expert TP = TP: the experts reduce over DP, as dense weights
    _fill(fc1)
    x = _x(7, HIDDEN)
    out, bias = fc1(x, [3, 0, 4])
    expected = torch.cat([x[:3] @ fc1.weight0.T + fc1.bias0, x[3:] @ fc1.weight2.T + fc1.bias2])
    assert bias is None and torch.allclose(out, expected, atol=1e-6)


def test_row_grouped_linear_returns_per_expert_biases_with_skip_bias_add() -> None:
    fc2 = _grouped(TERowParallelGroupedLinear, bias=True, skip_bias_add=True, out_size=HIDDEN)
    assert fc2.weight0.partition_dim == 1 and fc2.bias0.tensor_model_parallel is False  # whole on every ETP rank
    _fill(fc2)
    x = _x(4, HIDDEN)
    out, biases = fc2(x, torch.tensor([1, 1, 2]))
    assert torch.allclose(out[2:], x[2:] @ fc2.weight2.T, atol=1e-6) and len(biases) == 3
    assert [n for n, *_ in _names(_grouped(TERowParallelGroupedLinear, False, False, HIDDEN))] == [
        "weight0", "weight1", "weight2"
    ]  # fmt: skip


def test_settings_the_stand_in_does_not_compute_are_refused() -> None:
    config = _config()
    config.delay_wgrad_compute = True  # (TransformerConfig would also want the MoE overlap it serves)
    with pytest.raises(NotImplementedError, match="delay_wgrad_compute"):
        TEColumnParallelLinear(HIDDEN, 8, config=config, init_method=None,
                               gather_output=False, bias=False, skip_bias_add=False, is_expert=False)  # fmt: skip
    with pytest.raises(NotImplementedError, match="context parallelism"):
        _attention(context_parallel_size=2)


def test_spec_is_validated_at_the_edge() -> None:
    with pytest.raises(BadInput, match="spec must be one of local, te"):
        compat.install("cpu", spec="transformer_engine")


def test_what_the_stand_in_cannot_build_is_a_limit_of_convcheck_not_a_finding() -> None:
    """A setting the stand-in refuses, an upstream check refusing one of its classes, or a TE placeholder it is not
    bound to: exit 2 naming the stand-in (bringup._environment_limit), never a bridge finding."""
    from convcheck.rank.bringup import _environment_limit

    config = _config()
    config.tp_comm_overlap = True
    with pytest.raises(NotImplementedError) as refused:
        TELinear(HIDDEN, 8, parallel_mode="column", config=config, init_method=None, bias=False,
                 skip_bias_add=False, skip_weight_param_allocation=False)  # fmt: skip
    limit = "on convcheck's Transformer Engine stand-in (--spec te)"
    assert _environment_limit(refused.value, "cpu", "te") == limit
    upstream = ValueError("Unsupported linear_q_down_proj: <class 'convcheck.kernels.te.linear.TELinear'>")
    assert _environment_limit(upstream, "cpu", "te") == limit
    assert _environment_limit(AttributeError("Mock object has no attribute 'module'"), "cpu", "te") == limit
    assert _environment_limit(TypeError("TENorm.__init__() got an unexpected keyword argument 'x'"), "cpu", "te")
    assert _environment_limit(ValueError("Expert bias for aux-loss-free routing"), "cpu", "te") is None
