"""Logits oracle: the comparison itself, the fp32 upcast, and HF vs sharded Megatron at several layouts."""

from pathlib import Path

import pytest
import torch

from convcheck.compare.bits import bytes_equal
from convcheck.oracles.fp32 import fp32_forward
from convcheck.oracles.logits import ABS_TOL, compare, eager, fixed_tokens, hf_logits, upcast_fp32
from tests.support.helpers import matrix_run, mutant, run_cli


def _logits(vocab: int = 10) -> torch.Tensor:
    return torch.randn(2, 3, vocab, generator=torch.Generator().manual_seed(0))


def test_identical_logits_pass_and_report_metrics() -> None:
    hf = _logits()
    findings, metrics = compare(hf.clone(), hf)
    assert findings == [] and metrics["max_abs_err"] == 0.0 and metrics["greedy_match"] == "6/6"
    assert metrics["abs_tol"] == ABS_TOL


def test_error_above_tolerance_is_named_with_its_position() -> None:
    hf = _logits()
    meg = hf.clone()
    meg[1, 2, 4] += 10 * ABS_TOL
    findings, metrics = compare(meg, hf)
    assert [f.kind for f in findings] == ["logits-differ"]
    assert findings[0].detail["index"] == [1, 2, 4]
    assert metrics["max_abs_err"] == pytest.approx(10 * ABS_TOL, rel=1e-2)


def test_nan_and_greedy_flip_fail() -> None:
    hf = _logits()
    meg = hf.clone()
    meg[0, 0, 0] = float("nan")
    assert "logits-differ" in {f.kind for f in compare(meg, hf)[0]}
    meg = hf.clone()
    meg[0, 1, (hf[0, 1].argmax() + 1) % 10] = hf[0, 1].max() + 1
    kinds = {f.kind: f for f in compare(meg, hf)[0]}
    assert kinds["greedy-differs"].detail["index"] == [0, 1]


def test_padded_vocab_columns_are_ignored_and_short_vocab_is_a_shape_finding() -> None:
    hf = _logits()
    assert compare(torch.cat([hf, torch.full((2, 3, 6), 99.0)], dim=-1), hf)[0] == []
    assert [f.kind for f in compare(hf[..., :8], hf)[0]] == ["shape"]


def test_upcast_restores_the_original_tensors_bit_for_bit() -> None:
    layer = torch.nn.Linear(4, 4).to(torch.bfloat16)
    before = layer.weight.data
    snapshot = before.clone()
    with upcast_fp32([layer]):
        assert layer.weight.dtype == torch.float32
    assert layer.weight.dtype == torch.bfloat16 and layer.weight.data_ptr() == before.data_ptr()
    assert bytes_equal(snapshot, layer.weight)


def test_a_tied_embedding_inside_a_wrapper_is_upcast_with_the_output_layer() -> None:
    """The weight a tied output layer reads is found however deep its language model sits (Qwen2.5-Omni's
    thinker.language_model): found once, and not at all where nothing ties."""
    from convcheck.oracles.logits import _tied

    class Language(torch.nn.Module):
        def __init__(self, tie: bool) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(8, 4)
            self.share_embeddings_and_output_weights = tie

        def shared_embedding_or_output_weight(self) -> torch.Tensor:
            return self.embedding.weight

    class Wrapper(torch.nn.Module):
        def __init__(self, tie: bool) -> None:
            super().__init__()
            self.thinker = torch.nn.Module()
            self.thinker.language_model = Language(tie)

    tied = Wrapper(True)
    found = _tied([tied])
    assert len(found) == 1 and found[0] is tied.thinker.language_model.embedding.weight
    assert _tied([Wrapper(False)]) == []


def _fp32_model_logits(name: str) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(checkpoint path, the fixed tokens, the logits of the fixture loaded whole in fp32 with `eager()` kernels)."""
    import transformers

    from convcheck.api import resolve_model

    path = resolve_model(name)
    tokens = fixed_tokens(int(transformers.AutoConfig.from_pretrained(path).vocab_size))
    fp32 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **eager())
    with torch.no_grad():
        return path, tokens, fp32.eval()(input_ids=tokens).logits.float()


@pytest.mark.parametrize("name", ["tiny:qwen3", "tiny:qwen3-moe", "tiny:qwen2-tied", "tiny:nemotron-h"])
def test_blockwise_fp32_reference_is_bitwise_the_fp32_model(name: str) -> None:
    """The HF reference loads in bf16 and upcasts one block at a time: the logits equal, bit for bit, those of the
    model loaded whole in fp32, and the bf16 parameters are back afterwards."""
    import transformers

    path, tokens, want = _fp32_model_logits(name)
    got = hf_logits(path, tokens)
    assert got.dtype == torch.float32 and bytes_equal(want, got)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype="auto", **eager()).eval()
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    with fp32_forward([model]), torch.no_grad():
        model(input_ids=tokens)
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("name", ["tiny:qwen3", "tiny:qwen3-moe", "tiny:qwen2-tied", "tiny:nemotron-h"])
def test_streamed_reference_is_bitwise_the_fp32_model(name: str) -> None:
    """The HF reference streamed one block at a time (transformers' own loader per block, fused experts, tied head,
    hybrid Mamba) gives, bit for bit, the logits of the model loaded whole in fp32, and leaves nothing loaded."""
    import transformers

    from convcheck.oracles import hf_stream
    from convcheck.oracles.logits import hf_reference

    path, tokens, want = _fp32_model_logits(name)
    layers = int(transformers.AutoConfig.from_pretrained(path).num_hidden_layers)
    loads: list[str] = []
    lazy: list[str] = []
    real, real_set = hf_stream.BlockLoader.load, hf_stream.BlockLoader._set
    try:
        hf_stream.BlockLoader.load = lambda self, prefix, block: (loads.append(prefix), real(self, prefix, block))[1]
        hf_stream.BlockLoader._set = lambda self, n, v, lazy_=False, **kw: (
            lazy.append(n) if kw.get("lazy", lazy_) else None,
            real_set(self, n, v, **kw),
        )[1]
        got, how = hf_reference(path, tokens)
    finally:
        hf_stream.BlockLoader.load, hf_stream.BlockLoader._set = real, real_set
    assert how == "streamed" and got.dtype == torch.float32 and bytes_equal(want, got)
    assert len(loads) == len(set(loads)) == layers + 3  # embedding, layers, norm, head
    if name == "tiny:qwen3-moe":  # the fused experts stayed bf16 and were upcast one expert at a time
        assert {n.rsplit(".", 1)[1] for n in lazy if ".mlp.experts." in n} == {"gate_up_proj", "down_proj"}, lazy


@pytest.mark.parametrize("name", ["tiny:qwen3-moe", "tiny:nemotron-h"])
def test_streamed_reference_with_one_loader_call_per_parameter_is_the_same(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At real size each large parameter gets a loader call of its own (the converter's staging never overlaps):
    with every parameter alone, the logits are still bitwise the fp32 model's."""
    from convcheck.oracles import hf_stream

    path, tokens, want = _fp32_model_logits(name)
    calls: list[int] = []
    real = hf_stream._batches
    monkeypatch.setattr(hf_stream, "ALONE_BYTES", 1)
    monkeypatch.setattr(hf_stream, "_batches", lambda *a: (lambda b: (calls.append(len(b)), b)[1])(real(*a)))
    assert bytes_equal(want, hf_stream.streamed_logits(path, tokens))
    assert max(calls) > 3  # a layer's parameters went through several loader calls


def test_upcast_on_use_reads_as_fp32_and_upcasts_only_the_slice_indexed() -> None:
    """A lazily upcast parameter keeps its stored bytes; an expert slice comes back fp32 and equal to the upcast
    whole; any other op sees the whole upcast; metadata reads touch nothing."""
    from convcheck.oracles.hf_stream import upcast_on_use

    stored = torch.randn(4, 3, 5).to(torch.bfloat16)
    p = upcast_on_use()(stored, requires_grad=False)
    assert p.dtype == torch.float32 and p.shape == (4, 3, 5) and p.dim() == 3 and not p.is_meta
    assert p.data_ptr() == stored.data_ptr()
    one = p[2]
    assert type(one) is torch.Tensor and one.dtype == torch.float32 and bytes_equal(one, stored[2].float())
    x = torch.randn(7, 5)
    assert bytes_equal(torch.nn.functional.linear(x, p[1]), torch.nn.functional.linear(x, stored.float()[1]))
    assert bytes_equal(p * 2, stored.float() * 2)


def test_streamed_reference_refuses_a_conversion_it_cannot_prove(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key conversion not known to only move elements (here: every one, by emptying the list) is refused; the
    reference says so and loads the model whole (same bits)."""
    import transformers

    from convcheck.api import resolve_model
    from convcheck.oracles import hf_stream
    from convcheck.oracles.logits import hf_reference

    path = resolve_model("tiny:qwen3-moe")
    tokens = fixed_tokens(int(transformers.AutoConfig.from_pretrained(path).vocab_size))
    monkeypatch.setattr(hf_stream, "MOVES_ONLY", set())
    with pytest.raises(NotImplementedError, match="key conversions that compute"):
        hf_stream.streamed_logits(str(path), tokens)
    got, how = hf_reference(path, tokens)
    assert how.startswith("whole (not streamed: NotImplementedError") and bytes_equal(hf_logits(path, tokens), got)


def block_and_whole_upcast(ctx) -> dict:  # type: ignore[no-untyped-def]
    """Rank function: the Megatron logits upcast block by block and whole, and the parameters after each."""
    from convcheck.oracles.logits import megatron_logits

    params = lambda: {n: (p.dtype, p.data_ptr()) for c in ctx.model for n, p in c.named_parameters()}  # noqa: E731
    before = params()
    tokens = fixed_tokens(int(ctx.checkpoint.config["vocab_size"]))
    block = megatron_logits(ctx, tokens)
    after = params()
    whole = megatron_logits(ctx, tokens, whole=True)
    same = block is None or (block.dtype == torch.float32 and bytes_equal(block, whole))
    ok = ctx.gather((same, before == after == params(), sorted({str(d) for d, _ in before.values()})))
    return {"same": [s for s, _, _ in ok], "restored": [r for _, r, _ in ok], "dtypes": ok[0][2]}


@pytest.mark.ranks
@pytest.mark.parametrize(
    "model,layout", [("tiny:qwen2-tied", "tp2"), ("tiny:nemotron-h", "tp2"), ("tiny:qwen3-moe", "pp2")]
)
def test_megatron_blockwise_upcast_is_bitwise_the_whole_upcast(model: str, layout: str) -> None:
    """The logits oracle upcasts one Megatron block at a time: the same logits, bit for bit, as upcasting the whole
    chunk (tied embedding read by the head, Mamba's params_dtype cast, a pipeline), every parameter back after."""
    from convcheck.api import run_in_ranks

    out = run_in_ranks(f"{__file__}:block_and_whole_upcast", model, layout)
    assert out == {"same": [True, True], "restored": [True, True], "dtypes": ["torch.bfloat16"]}


def test_tokens_are_fixed() -> None:
    assert bytes_equal(fixed_tokens(152), fixed_tokens(152)) and int(fixed_tokens(152).max()) < 152


@pytest.mark.ranks
@pytest.mark.parametrize(
    "model,layout",
    [("qwen3", ("--tp", "2")), ("qwen3", ("--pp", "2")), ("qwen3-moe", ("--tp", "2")), ("qwen2-tied", ())],
    ids=["qwen3-TP2", "qwen3-PP2", "qwen3-moe-TP2", "qwen2-tied-TP1"],
)
def test_logits_match_hf(shared_root: Path, model: str, layout: tuple[str, ...]) -> None:
    res, _ = matrix_run(shared_root, model, layout)  # the verify-matrix run of this case: every default oracle
    assert res.code == 0, res.out + res.err
    assert set(res.verdicts().values()) == {"pass"} and "logits" in res.verdicts()
    logits = next(o for o in res.report["oracles"] if o["name"] == "logits")
    assert logits["unit"] == "logits" and logits["checked"] == 2 * 16 * 152
    metrics = logits["metrics"]
    assert metrics["max_abs_err"] <= metrics["abs_tol"] and metrics["greedy_match"] == "32/32"
    assert "max_abs_err=" in res.out


@pytest.mark.ranks
def test_weight_bug_invisible_to_config_is_caught_by_logits(tmp_path: Path) -> None:
    res = run_cli("verify", "--oracle", "config,logits", "--model", "tiny:qwen3", "--tp", "2",
                  "--hook", mutant("config", "scale_o_proj_on_import"), tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out + res.err
    assert res.verdicts() == {"config": "pass", "logits": "fail"}
    kinds = {f["kind"]: f for f in res.findings("logits")}
    assert kinds["logits-differ"]["tensor"] == "logits"
    assert kinds["logits-differ"]["detail"]["max_abs_err"] > ABS_TOL


def test_streamed_reference_reads_only_the_files_from_pretrained_reads(tmp_path: Path) -> None:
    """The index's files, else model.safetensors, else the one *.safetensors: a stray file (an adapter, a consolidated
    copy) is never streamed as model weights."""
    import json

    from convcheck.oracles.hf_stream import _weight_files

    for name in ("model-00001.safetensors", "model-00002.safetensors", "adapter.safetensors"):
        (tmp_path / name).write_bytes(b"")
    index = {"weight_map": {"a": "model-00002.safetensors", "b": "model-00001.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert [f.name for f in _weight_files(tmp_path)] == ["model-00001.safetensors", "model-00002.safetensors"]
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(FileNotFoundError, match="3 other"):
        _weight_files(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert [f.name for f in _weight_files(tmp_path)] == ["model.safetensors"]


def test_the_fp32_forward_keeps_softmax_probabilities_in_fp32_and_restores_the_flags() -> None:
    """megatron-core's softmax built for bf16 input casts its fp32 probabilities back to bf16 (fused_softmax.py:336-340)
    when attention_softmax_in_fp32 is on, as GLM-4.7-Flash's bridge leaves it; the value matmul then mixes dtypes."""
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.utils import attention_mask_func

    softmax = FusedScaleMaskSoftmax(
        input_in_fp16=False, input_in_bf16=True, attn_mask_type=AttnMaskType.padding,
        scaled_masked_softmax_fusion=False, mask_func=attention_mask_func, softmax_in_fp32=True, scale=None,
    )  # fmt: skip
    model = torch.nn.Sequential(torch.nn.Linear(4, 4).to(torch.bfloat16), softmax)
    scores, mask = torch.randn(1, 1, 3, 3), torch.zeros(1, 1, 3, 3, dtype=torch.bool)
    assert softmax(scores, mask).dtype == torch.bfloat16  # upstream as built for bf16
    with upcast_fp32([model]):
        assert softmax(scores, mask).dtype == torch.float32
    assert (softmax.input_in_fp16, softmax.input_in_bf16, softmax.input_in_float16) == (False, True, True)
    assert softmax(scores, mask).dtype == torch.bfloat16


def test_the_fixed_tokens_of_a_multimodal_config_hold_no_placeholder() -> None:
    """A wrapper's image / video / audio ids (top level or nested, as Qwen2.5-Omni's thinker holds them) are never
    fed: each drawn placeholder becomes another id, every other position keeps the same draw."""
    from convcheck.oracles.logits import placeholder_ids

    config = {"vocab_size": 256, "image_token_id": 250, "video_token_id": 249, "bos_token_id": 2,
              "thinker_config": {"audio_token_index": 253, "vision_start_token_id": 242, "top_k": 1}}  # fmt: skip
    avoid = placeholder_ids(config)
    assert avoid == {250, 249, 253, 242}
    plain, text = fixed_tokens(256), fixed_tokens(256, avoid)
    hit = torch.isin(plain, torch.tensor(sorted(avoid)))
    assert int(hit.sum()) >= 1 and int(plain[0, 7]) == 249  # the draw holds Gemma 4's video id
    assert not bool(torch.isin(text, torch.tensor(sorted(avoid))).any())
    assert torch.equal(text[~hit], plain[~hit]) and bool((text[hit] < 256).all())
    assert bytes_equal(fixed_tokens(256, frozenset()), plain)
