"""Hybrid forward shim 10 (torch Mamba scan) and the logits oracle's params_dtype switch: each test fails once
upstream no longer needs it, and the stand-ins compute what transformers' NemotronH torch path computes."""

import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

from convcheck import compat
from convcheck.kernels.mamba import GatedRMSNorm, torch_chunk_scan, torch_split_conv1d_scan


def _module_text(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    return Path(spec.origin).read_text()


def test_shim10_still_needed_mamba_forward_calls_mamba_ssm_kernels() -> None:
    """Fails when mamba_ssm is installed or the mixer stops calling its scan kernels (then drop shim 10)."""
    assert importlib.util.find_spec("mamba_ssm") is None
    text = _module_text("megatron.core.ssm.mamba_mixer")
    bound_to_none = "    mamba_chunk_scan_combined = None\n    mamba_split_conv1d_scan_combined = None\n" in text
    left_unbound = "from mamba_ssm.ops.triton.ssd_combined import" in text and "except ImportError" in text  # 0.16.x
    assert bound_to_none or left_unbound
    compat.install_import_shims()
    from megatron.core.ssm.mamba_mixer import MambaMixer

    assert "y = mamba_split_conv1d_scan_combined(" in inspect.getsource(MambaMixer._ssm_training)
    assert "y = mamba_chunk_scan_combined(" in inspect.getsource(MambaMixer._ssm_prefill)


def test_logits_upcast_still_needs_params_dtype() -> None:
    """mamba_layer.py:151 casts activations to config.params_dtype: the fp32 upcast must switch that dtype too."""
    assert "hidden_states = hidden_states.to(dtype=self.config.params_dtype)" in _module_text(
        "megatron.core.ssm.mamba_layer"
    )


def test_upcast_switches_and_restores_params_dtype() -> None:
    from convcheck.oracles.logits import upcast_fp32

    layer = torch.nn.Linear(2, 2).to(torch.bfloat16)
    layer.config = type("Config", (), {"params_dtype": torch.bfloat16})()
    with upcast_fp32([layer]):
        assert layer.config.params_dtype == torch.float32 and layer.weight.dtype == torch.float32
    assert layer.config.params_dtype == torch.bfloat16 and layer.weight.dtype == torch.bfloat16


def test_shim10_is_idempotent_and_only_fills_missing_kernels() -> None:
    compat.install_import_shims()
    from megatron.core.ssm import mamba_mixer

    compat.install_hybrid_forward_shims()
    compat.install_hybrid_forward_shims()
    assert mamba_mixer.mamba_split_conv1d_scan_combined is torch_split_conv1d_scan
    assert mamba_mixer.mamba_chunk_scan_combined is torch_chunk_scan


def _recurrence(x, dt, A, B, C, D, z):  # type: ignore[no-untyped-def]
    """The selective SSM one step at a time (the definition the chunked scan must reproduce), float64."""
    batch, length, heads, dim = x.shape
    repeat = heads // B.shape[2]
    Bh, Ch = B.repeat_interleave(repeat, dim=2), C.repeat_interleave(repeat, dim=2)
    state = torch.zeros(batch, heads, dim, B.shape[-1], dtype=x.dtype)
    ys = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * A)[..., None, None]
        state = decay * state + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        ys.append((state * Ch[:, t, :, None, :]).sum(-1) + D[:, None] * x[:, t])
    return torch.stack(ys, dim=1) * torch.nn.functional.silu(z)


@pytest.mark.parametrize("length,chunk", [(11, 4), (16, 128), (8, 8)], ids=["3-chunks-padded", "one-chunk", "exact"])
def test_chunk_scan_equals_the_recurrence(length: int, chunk: int) -> None:
    gen = torch.Generator().manual_seed(length)
    batch, heads, dim, groups, state = 2, 4, 3, 2, 5
    x = torch.randn(batch, length, heads, dim, generator=gen, dtype=torch.float64)
    dt_raw = torch.randn(batch, length, heads, generator=gen, dtype=torch.float64)
    dt_bias = torch.randn(heads, generator=gen, dtype=torch.float64)
    A = -torch.rand(heads, generator=gen, dtype=torch.float64) * 3
    B, C = (torch.randn(batch, length, groups, state, generator=gen, dtype=torch.float64) for _ in range(2))
    D = torch.randn(heads, generator=gen, dtype=torch.float64)
    z = torch.randn(batch, length, heads, dim, generator=gen, dtype=torch.float64)
    got = torch_chunk_scan(x.float(), dt_raw.float(), A.float(), B.float(), C.float(), chunk, D=D.float(),
                           z=z.float(), dt_bias=dt_bias.float(), dt_softplus=True)  # fmt: skip
    want = _recurrence(x, torch.nn.functional.softplus(dt_raw + dt_bias), A, B, C, D, z)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_split_conv1d_scan_matches_transformers_nemotron_h_mixer() -> None:
    """in_proj -> shim 10 -> shim 8's gated norm -> out_proj equals HF NemotronHMamba2Mixer.torch_forward."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "NemotronHConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no NemotronH")
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    # HF's torch path clamps dt from below at time_step_min; its kernel path (and mamba_ssm, Megatron) use
    # dt_limit=(0, inf): time_step_min=0 makes both HF paths the same function. One chunk (11 <= 16): transformers
    # 5.12.1's torch path sums the inter-chunk states over the wrong axis (Zamba2/NemotronH slow path, transformers
    # PR #47250), so beyond one chunk only the recurrence test above is the reference.
    config = NemotronHConfig(hidden_size=16, mamba_num_heads=4, mamba_head_dim=6, n_groups=2, ssm_state_size=5,
                             conv_kernel=4, chunk_size=16, use_mamba_kernels=False, time_step_min=0.0,
                             layers_block_type=["mamba"])  # fmt: skip
    torch.manual_seed(0)
    hf = NemotronHMamba2Mixer(config, layer_idx=0).float()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    hidden = torch.randn(2, 11, 16)
    norm = GatedRMSNorm(24, eps=config.layer_norm_epsilon, group_size=12, norm_before_gate=False)
    with torch.no_grad():
        norm.weight.copy_(hf.norm.weight)
        y = torch_split_conv1d_scan(hf.in_proj(hidden), hf.conv1d.weight[:, 0], hf.conv1d.bias, hf.dt_bias,
                                    -torch.exp(hf.A_log.float()), hf.D, config.chunk_size, headdim=6,
                                    ngroups=2, norm_before_gate=False)  # fmt: skip
        ours = hf.out_proj(norm(y))
        want = hf.torch_forward(hidden)
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)


def test_unsupported_arguments_raise() -> None:
    x = torch.zeros(1, 2, 2, 2)
    with pytest.raises(NotImplementedError, match="initial_states, return_final_states"):
        torch_chunk_scan(x, torch.zeros(1, 2, 2), torch.zeros(2), torch.zeros(1, 2, 1, 2),
                         torch.zeros(1, 2, 1, 2), 4, initial_states=x, return_final_states=True)  # fmt: skip
