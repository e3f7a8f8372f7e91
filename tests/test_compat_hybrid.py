"""Hybrid (NemotronH) construction shims 7-9 and settings: each test fails once upstream no longer needs it."""

import inspect

import pytest
import torch

from convcheck import compat
from convcheck.compat._patch import shims_on
from convcheck.compat.detect import hybrid_stack, optional_module, site_present
from convcheck.kernels.mamba import GatedRMSNorm
from tests.support.release_targets import on_current_pins, skip_unless, upstream_source


def _original(func):  # type: ignore[no-untyped-def]
    return compat.upstream(func)


def test_shim7_still_needed_hybrid_final_norm_is_tenorm() -> None:
    """Fails when HybridStack stops hard-wiring TENorm for the final norm (then delete shim 7)."""
    compat.install_import_shims()
    from megatron.core.extensions.transformer_engine import HAVE_TE

    found = hybrid_stack()  # HybridStack; MambaStack up to megatron-core 0.17
    skip_unless(found is not None, "a Mamba hybrid stack")
    assert not HAVE_TE
    assert "self.final_norm = TENorm(" in inspect.getsource(_original(found[1].__init__))


def test_shim8_still_needed_mamba_mixer_needs_mamba_ssm_and_cuda() -> None:
    """Fails when MambaMixer builds without mamba_ssm or stops allocating on CUDA (then delete shim 8)."""
    from megatron.core.ssm import mamba_mixer

    assert mamba_mixer.HAVE_MAMBA_SSM is False  # the shim restores the module's flag after each construction
    source = inspect.getsource(_original(mamba_mixer.MambaMixer.__init__))
    assert "if not HAVE_MAMBA_SSM:" in source and "raise ImportError" in source
    assert "device=torch.cuda.current_device()" in source
    assert "self.norm = ExtendedRMSNorm(" in source
    assert source.count("get_cuda_rng_tracker().fork()") == 2  # covered by shim 6 on CPU


def test_shim9_still_needed_router_buffers_on_cuda() -> None:
    """Fails when TopKRouter stops allocating its expert-bias buffers on CUDA (then delete shim 9)."""
    from megatron.core.transformer.moe.router import TopKRouter

    source = inspect.getsource(_original(TopKRouter.__init__))
    assert "'expert_bias'" in source and "device=torch.cuda.current_device()" in source


@pytest.mark.parametrize(
    "module,attribute,where", compat.CPU_CONSTRUCTOR_SITES, ids=[s[1] for s in compat.CPU_CONSTRUCTOR_SITES]
)
def test_shim9_sites_still_allocate_on_cuda(module: str, attribute: str, where: str) -> None:
    """Fails when a constructor in CPU_CONSTRUCTOR_SITES no longer allocates on torch.cuda.current_device() there."""
    owner = optional_module(module)
    skip_unless(owner is not None and site_present(owner, attribute), f"{module}.{attribute} ({where})")
    if not on_current_pins():  # another release: the same constructor, checked by content
        assert "torch.cuda.current_device()" in upstream_source(module, attribute), f"drop {attribute} from shim 9"
        return
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    source = Path(spec.origin).read_text().splitlines()
    line = int(where.rpartition(":")[2])
    assert "torch.cuda.current_device()" in source[line - 1], f"{where} changed: {source[line - 1].strip()!r}"
    cls = attribute.partition(".")[0]
    start = max(i for i, s in enumerate(source[:line]) if s.startswith(f"class {cls}("))
    init = min(i for i in range(start, line) if source[i].lstrip().startswith("def __init__("))
    assert not any(s.lstrip().startswith(("def ", "class ")) for s in source[init + 1 : line]), (
        f"{where} is not inside {attribute} any more"
    )


def test_shim9_wraps_the_gated_deltanet_constructor_of_this_release() -> None:
    """The constructor that allocates GatedDeltaNet's conv1d / dt_bias / A_log on CUDA is wrapped whichever module
    holds it: _GDNBase.__init__ of ssm/gated_delta_net/common.py (megatron-core 0.19) or GatedDeltaNet.__init__ of the
    one module ssm/gated_delta_net.py (0.17-0.18, the 0.5.x VL build's `gated_delta_net.py:179` without it). The
    0.19 package's re-exported GatedDeltaNet is not taken for the older site."""
    package = optional_module("megatron.core.ssm.gated_delta_net")
    skip_unless(package is not None, "gated DeltaNet")
    compat.install("cpu")
    cls = package.GatedDeltaNet
    assert site_present(package, "GatedDeltaNet.__init__") is (cls.__module__ == package.__name__)
    inits = {k: _original(vars(k)["__init__"]) for k in cls.__mro__ if "__init__" in vars(k)}
    allocating = [
        k for k, init in inits.items()
        if inspect.isfunction(init) and "torch.cuda.current_device()" in inspect.getsource(init)
    ]  # fmt: skip
    assert allocating, "no constructor of GatedDeltaNet allocates on CUDA any more: drop its shim 9 site"
    for k in allocating:
        assert "convcheck.compat.no_cuda._on_cpu_device" in shims_on(vars(k)["__init__"]), k.__qualname__
    # a re-export of a wrapped target is a moved site, not an absent one (0.19 records no shim 9 skip for it)
    assert "megatron.core.ssm.gated_delta_net.GatedDeltaNet" not in compat.skipped().get(9, "")


def test_shims_are_idempotent_and_restore_module_state() -> None:
    compat.install("cpu")
    from megatron.core.ssm import mamba_mixer
    from megatron.core.transformer.moe.router import TopKRouter

    hybrid_block, stack, _ = hybrid_stack()  # HybridStack; MambaStack up to megatron-core 0.17
    inits = (stack.__init__, mamba_mixer.MambaMixer.__init__, TopKRouter.__init__)
    compat.install("cpu")
    assert inits == (stack.__init__, mamba_mixer.MambaMixer.__init__, TopKRouter.__init__)
    assert all(getattr(f, "_convcheck_shim", False) for f in inits)
    assert hybrid_block.TENorm.__name__ == "TENorm" and mamba_mixer.HAVE_MAMBA_SSM is False


def test_cpu_gated_norm_matches_hf_nemotron_h_gated_norm() -> None:
    """The stand-in computes what HF NemotronH's gated RMSNorm computes (groups of d/G, silu gate before norm)."""
    from transformers.models.zamba2.modeling_zamba2 import Zamba2RMSNormGated

    norm = GatedRMSNorm(32, eps=1e-5, group_size=16, norm_before_gate=False, dtype=torch.float32)
    ref = Zamba2RMSNormGated(32, group_size=16, eps=1e-5)
    gen = torch.Generator().manual_seed(0)
    weight = torch.rand(32, generator=gen)
    with torch.no_grad():
        norm.weight.copy_(weight)
        ref.weight.copy_(weight)
    x, z = torch.randn(2, 5, 32, generator=gen), torch.randn(2, 5, 32, generator=gen)
    torch.testing.assert_close(norm(x, z), ref(x, gate=z), rtol=1e-6, atol=1e-6)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_hybrid_provider_settings_still_needed() -> None:
    """The provider settings in configure_hybrid_provider answer upstream lines that still exist."""
    compat.install_import_shims()
    from megatron.bridge.models.nemotronh import nemotron_h_bridge
    from megatron.core.post_training.modelopt import layers
    from megatron.core.transformer.moe import shared_experts

    hybrid_provider = optional_module("megatron.bridge.models.hybrid.hybrid_provider")
    if not on_current_pins() and hybrid_provider is None:  # bridge <= 0.5: MambaModelProvider's mamba_stack_spec
        source = upstream_source("megatron.bridge.models.mamba.mamba_provider", "get_default_mamba_stack_spec")
        assert "return transformer_engine_mamba_stack_spec()" in source
        assert "torch.cuda.Stream()" in inspect.getsource(shared_experts.SharedExpertMLP.__init__)
        return
    assert hybrid_provider is not None
    assert "return transformer_engine_hybrid_stack_spec()" in inspect.getsource(
        hybrid_provider.get_default_hybrid_stack_spec
    )
    assert "if not HAVE_TE:" in inspect.getsource(layers.Norm.__new__)
    assert "provider.moe_shared_expert_overlap = True" in inspect.getsource(nemotron_h_bridge.NemotronHBridge)
    assert "torch.cuda.Stream()" in inspect.getsource(shared_experts.SharedExpertMLP.__init__)
    assert hybrid_provider.DEFAULT_MAMBA_CHUNK_SIZE == 128  # other sizes deep-copy the spec


def test_gpt_provider_path_unchanged() -> None:
    """configure_provider sets the hybrid spec only on hybrid providers."""

    class Gpt:
        transformer_layer_spec = None

    class Hybrid:
        hybrid_stack_spec = None
        moe_shared_expert_overlap = True

    gpt, hybrid = Gpt(), Hybrid()
    compat.configure_provider(gpt, "cpu")
    compat.configure_provider(hybrid, "cpu")
    assert not hasattr(gpt, "hybrid_stack_spec") and gpt.transformer_layer_spec is not None
    assert hybrid.hybrid_stack_spec is compat.cpu_hybrid_stack_spec and hybrid.moe_shared_expert_overlap is False
