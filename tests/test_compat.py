"""Each compatibility shim has a test that fails once upstream no longer needs it, and one that it is narrow."""

import importlib.util
import inspect
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

from convcheck.boot import imports_te_unconditionally

import pytest

from convcheck import compat
from tests.support.release_targets import on_current_pins, release_label, skip_unless


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180)


def test_pinned_versions_are_the_targets() -> None:
    if not on_current_pins():
        pytest.skip(f"{release_label()} is an older release's env: tests/test_releases.py checks its pins")
    for dist, version in compat.TARGET_VERSIONS.items():
        assert metadata.version(dist) == version, f"{dist} changed: re-check every shim in convcheck/compat/"


def test_shim1_still_needed_lora_layers_imports_transformer_engine() -> None:
    """Fails when megatron-bridge stops importing TE unconditionally (then delete shim 1): its source, read without
    importing it, imports transformer_engine at module level (outside any try), and TE is not installed."""
    assert not compat.transformer_engine_available()
    bridge = importlib.util.find_spec("megatron.bridge")  # its location only: the package is not run
    assert bridge is not None and bridge.origin is not None
    assert imports_te_unconditionally((Path(bridge.origin).parent / "peft" / "lora_layers.py").read_text())


@pytest.mark.fresh_process
def test_shim1_is_narrow_megatron_core_still_sees_no_te() -> None:
    res = _run(
        """
        import sys
        from convcheck import compat
        compat.install_import_shims()
        import megatron.bridge.peft.lora_layers as lora
        from megatron.bridge import AutoBridge
        from megatron.core.extensions.transformer_engine import HAVE_TE
        assert HAVE_TE is False, HAVE_TE
        assert not [m for m in sys.modules if m.split('.')[0] == 'transformer_engine'], 'stand-in leaked'
        try:
            lora.te.pytorch.Linear()
        except RuntimeError as e:
            assert 'inert' in str(e)
        else:
            raise SystemExit('stand-in call did not fail')
        print('ok')
        """
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]


@pytest.mark.fresh_process
def test_shim2_still_needed_replicated_mapping_calls_cuda() -> None:
    """Fails when ReplicatedMapping.hf_to_megatron stops calling torch.cuda at TP>1 (then delete shim 2)."""
    compat.install_import_shims()
    from megatron.bridge.models.conversion.param_mapping import ReplicatedMapping

    method = compat.upstream(ReplicatedMapping.hf_to_megatron)
    assert "torch.cuda.current_device()" in inspect.getsource(method)


def test_shim3_still_needed_tied_embedding_setup_calls_cuda() -> None:
    """Fails when LanguageModule stops moving the tied weight to CUDA (then delete shim 3)."""
    from megatron.core.models.common.language_module.language_module import LanguageModule

    method = compat.upstream(LanguageModule.setup_embeddings_and_output_layer)
    assert "weight.data.cuda()" in inspect.getsource(method)


def test_cpu_settings_still_needed() -> None:
    """The provider settings in configure_provider answer upstream lines that still exist."""
    compat.install_import_shims()
    from megatron.bridge.models import gpt_provider
    from megatron.bridge.models.qwen import qwen3_moe_bridge
    from megatron.core.transformer.moe import token_dispatcher

    alltoall = 'moe_token_dispatcher_type = "alltoall"' in inspect.getsource(qwen3_moe_bridge)
    if not on_current_pins():
        skip_unless(alltoall, "Qwen3MoEBridge selecting the alltoall dispatcher")
    assert alltoall
    assert "torch.cuda.Stream" in inspect.getsource(token_dispatcher.MoEAlltoAllTokenDispatcher)
    assert "transformer_engine_layer_spec" in inspect.getsource(gpt_provider.default_layer_spec)


@pytest.mark.fresh_process
def test_a_spec_whose_module_helper_reads_have_te_is_built_with_te() -> None:
    """Ernie 4.5 VL's decoder spec picks its linears in a helper that reads the module's HAVE_TE
    (ernie_decoder_layer_spec.py:63, `_get_linear_modules`): without TE, linear_qkv is a ColumnParallelLinear with no
    input norm at all, a model production never builds. `te_block_spec` follows the spec function's calls into its
    module, so the TE layout is built on the stand-in (its fused norm, which the bridge maps input_layernorm to); a
    function of the module that never reaches HAVE_TE is left as it is."""
    res = _run(
        """
        from convcheck import compat
        compat.install("cpu", "te")
        from megatron.bridge.models.ernie_vl.modeling_ernie45_vl import ernie_decoder_layer_spec as m
        from convcheck.compat.provider import reads_have_te, te_block_spec
        assert m.HAVE_TE is False
        assert reads_have_te(m.get_ernie45_vl_decoder_block_spec, m)
        assert not reads_have_te(m.ErnieMultiTypeMoE.__init__, m)
        qkv = lambda spec: spec.submodules.self_attention.submodules.linear_qkv.__name__
        assert qkv(m._get_ernie_decoder_layer_spec()) == "ColumnParallelLinear"
        assert qkv(te_block_spec(m._get_ernie_decoder_layer_spec)()) == "TELayerNormColumnParallelLinear"
        assert m.HAVE_TE is False
        print("ok")
        """
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]
