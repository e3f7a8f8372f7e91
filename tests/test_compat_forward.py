"""Forward-pass shims 4-6 (convcheck/compat/no_cuda.py): each test fails once upstream no longer needs its shim."""

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from convcheck import compat
from tests.support.release_targets import on_current_pins, upstream_source


def _source_line(module: str, line: int) -> str:
    """Line `line` of an upstream module's file, read without importing it."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    return Path(spec.origin).read_text().splitlines()[line - 1]


def _module_text(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    return Path(spec.origin).read_text()


@pytest.mark.parametrize("module,attribute,where", compat.CPU_DEVICE_SITES, ids=[s[1] for s in compat.CPU_DEVICE_SITES])
def test_shim4_site_still_targets_cuda_current_device(module: str, attribute: str, where: str) -> None:
    """Fails when the documented line no longer allocates on / moves to torch.cuda.current_device()."""
    if not on_current_pins():  # another release: the same function, checked by content
        assert "torch.cuda.current_device()" in upstream_source(module, attribute), f"drop {attribute} from shim 4"
        return
    line = int(where.rpartition(":")[2])
    text = _source_line(module, line)
    assert "torch.cuda.current_device()" in text, f"{where} changed: {text.strip()!r}; drop this site from shim 4"
    source = _module_text(module).splitlines()
    name = attribute.rpartition(".")[2]
    start = max(i for i, s in enumerate(source[:line]) if s.lstrip().startswith(f"def {name}("))
    assert start < line - 1, f"{where} is not inside {attribute} any more"


def test_shim5_causal_mask_still_built_on_cuda() -> None:
    """utils.py:39 still hard-codes device="cuda" and fused_softmax still imports the function by name."""
    if on_current_pins():
        assert 'device="cuda"' in _source_line("megatron.core.transformer.utils", 39)
        assert "def get_default_causal_mask" in _source_line("megatron.core.transformer.utils", 37)
    else:  # another release: the same function, checked by content
        assert 'device="cuda"' in upstream_source("megatron.core.transformer.utils", "get_default_causal_mask")
    assert "from megatron.core.transformer.utils import get_default_causal_mask" in _module_text(
        "megatron.core.fusions.fused_softmax"
    )


def test_shim22_sliding_window_mask_still_built_on_cuda() -> None:
    """utils.py:44 still makes the sliding-window mask with device="cuda"; fused_softmax imports it by name."""
    if on_current_pins():
        assert 'device="cuda"' in _source_line("megatron.core.transformer.utils", 44)
        assert "def get_sliding_window_causal_mask" in _source_line("megatron.core.transformer.utils", 42)
    else:  # another release: the same function, checked by content
        assert 'device="cuda"' in upstream_source("megatron.core.transformer.utils", "get_sliding_window_causal_mask")
    assert "get_sliding_window_causal_mask" in _module_text("megatron.core.fusions.fused_softmax")


@pytest.mark.fresh_process
def test_shim6_attention_dropout_still_forks_cuda_rng() -> None:
    """dot_product_attention.py:217 still forks the CUDA RNG tracker, whose fork reads the CUDA RNG state."""
    if on_current_pins():
        assert "get_cuda_rng_tracker().fork()" in _source_line("megatron.core.transformer.dot_product_attention", 217)
    else:  # another release: the same method, checked by content
        forward = upstream_source("megatron.core.transformer.dot_product_attention", "DotProductAttention.forward")
        assert "get_cuda_rng_tracker().fork()" in forward
    random_src = _module_text("megatron.core.tensor_parallel.random")
    start = random_src.index("    def fork(self, name=_MODEL_PARALLEL_RNG_TRACKER_NAME):")
    body = random_src[start : random_src.index("\n    def ", start + 10)]
    assert "_get_cuda_rng_state(" in body and "_set_cuda_rng_state(" in body


@pytest.mark.fresh_process
def test_forward_shims_compute_what_upstream_computes_and_are_idempotent() -> None:
    """In a fresh process without CUDA: installed once, each shim yields upstream's formula on the CPU."""
    code = """
        import torch
        from convcheck import compat
        assert not torch.cuda.is_available()
        compat.install("cpu")
        compat.install("cpu")
        from megatron.core.fusions import fused_softmax
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
        from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
        from megatron.core.transformer import utils
        from megatron.core.utils import GlobalMemoryBuffer
        for fn in (RotaryEmbedding.get_emb, GlobalMemoryBuffer.get_tensor, utils.get_default_causal_mask,
                   utils.get_sliding_window_causal_mask, CudaRNGStatesTracker.fork):
            assert fn._convcheck_shim and not getattr(fn._convcheck_original, "_convcheck_shim", False)
        assert fused_softmax.get_default_causal_mask is utils.get_default_causal_mask
        mask = utils.get_default_causal_mask(5)
        assert mask.device.type == "cpu" and torch.equal(mask, torch.triu(torch.ones(5, 5), diagonal=1).bool())
        assert fused_softmax.get_sliding_window_causal_mask is utils.get_sliding_window_causal_mask
        window = utils.get_sliding_window_causal_mask(6, 6, (2, 0))  # key j kept for query i iff i - 2 <= j <= i
        want = torch.tensor([[not (i - 2 <= j <= i) for j in range(6)] for i in range(6)])
        assert window.device.type == "cpu" and torch.equal(window, want), window
        rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, rotary_base=10000, use_cpu_initialization=True)
        emb = rope.get_emb(6)
        inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
        freqs = torch.outer(torch.arange(6, dtype=torch.float32), inv)
        want = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
        assert emb.device.type == "cpu" and torch.equal(emb.view(torch.int32), want.view(torch.int32)), (emb, want)
        buf = GlobalMemoryBuffer().get_tensor((2, 3), torch.float32, "x")
        assert buf.device.type == "cpu" and buf.shape == (2, 3)
        with CudaRNGStatesTracker().fork():
            pass
        try:
            torch.cuda.current_device()
        except (RuntimeError, AssertionError):
            pass
        else:
            raise SystemExit("torch.cuda.current_device left patched")
        print("ok")
    """
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]
