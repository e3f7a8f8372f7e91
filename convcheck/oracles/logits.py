"""Logits oracle: HF and the loaded, sharded Megatron model agree on fp32 logits and greedy tokens.

Numeric, not bitwise: both models run in fp32 on the same fixed tokens; the verdict reports the measured
max abs error, the max error relative to the largest |HF logit|, and the thresholds they are held to.
The Megatron side is the very model the bridge loaded (every rank, real TP/EP/PP collectives), upcast in
place to fp32 one block at a time and restored to its original tensors afterwards. The HF side runs on rank 0's
device, each block streamed from the checkpoint in fp32 by transformers' loader just before it runs (or, where that
is not possible, the model loaded whole and upcast per block); both are bitwise the fp32-loaded model's logits.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

import torch
import torch.distributed as dist
import transformers
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.module import MegatronModule

from convcheck.compare.bits import int_view
from convcheck.errors import needs_cuda, one_line, raised_at
from convcheck.oracles import ORACLES
from convcheck.oracles.forward_site import ForwardSite, tracking
from convcheck.oracles.fp32 import fp32_forward
from convcheck.oracles.hf_stream import eager, lm_auto_class, logits_module, streamed_logits
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "logits"
INFO = ORACLES[NAME]
SEED = 1234
"""Seed of the token generator (torch.Generator, CPU)."""
BATCH, SEQ = 2, 16
"""Token grid [BATCH, SEQ]; SEQ stays below every fixture's max_position_embeddings."""
ABS_TOL = 1e-4
"""Max |megatron - hf| over all logits (fp32 on CPU measures ~1e-6 on the tiny fixtures)."""
REL_TOL = 1e-5
"""Max |megatron - hf| divided by max |hf| (scale-free form of the same bound)."""


def fixed_tokens(vocab_size: int, avoid: frozenset[int] = frozenset()) -> Any:
    """The input ids, [BATCH, SEQ] int64, identical on every rank and every run. A drawn id in `avoid` (a multimodal
    placeholder, placeholder_ids) becomes the (id mod n)-th of the n other ids: text tokens only, the same draw."""
    gen = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.long)
    if avoid:
        allowed = torch.tensor([i for i in range(vocab_size) if i not in avoid], dtype=torch.long)
        hit = torch.isin(tokens, torch.tensor(sorted(avoid), dtype=torch.long))
        tokens = torch.where(hit, allowed[tokens % len(allowed)], tokens)
    return tokens


PLACEHOLDER = re.compile(r"(image|video|audio|vision|boi|eoi|boa|eoa|tts)\w*_token_(id|index)$")
"""config.json keys naming a multimodal token (image / video / audio placeholders and their delimiters): a wrapper's
forward replaces or routes these ids (Gemma 4 masks its video id, Qwen2.5-VL's rope index wants a video grid for
it), so the text-only logits oracle never feeds them."""


def placeholder_ids(config: dict[str, Any]) -> frozenset[int]:
    """Every id a PLACEHOLDER key of `config` (or of a config nested in it) holds."""
    found: set[int] = set()
    for key, value in config.items():
        if isinstance(value, dict):
            found |= placeholder_ids(value)
        elif PLACEHOLDER.search(key) and isinstance(value, int) and not isinstance(value, bool):
            found.add(value)
    return frozenset(found)


VOCAB_PATHS = ((), ("text_config",), ("thinker_config", "text_config"))
"""Where a config.json holds the language model's vocabulary, in order: its own, its text_config's (a vision-language
checkpoint), its thinker's text_config's (Qwen2.5-Omni, whose talker has a codec vocabulary of its own)."""


def vocab_size(config: dict[str, Any]) -> int:
    """The vocabulary of a config.json (the first of VOCAB_PATHS that has one); KeyError when none has."""
    for path in VOCAB_PATHS:
        node: Any = config
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and "vocab_size" in node:
            return int(node["vocab_size"])
    raise KeyError("vocab_size")


def _unwrap(module: Any) -> Any:
    while hasattr(module, "module"):
        module = module.module
    return module


@contextmanager
def upcast_fp32(model: list[MegatronModule], whole: bool = False) -> Iterator[None]:
    """fp32 forward of the Megatron chunks, one block at a time (`whole`: all at once); module configs'
    params_dtype is fp32 meanwhile, as a forward casts activations to it (megatron-core 0.19.2
    ssm/mamba_layer.py:151), and the attention softmax keeps fp32 probabilities (with attention_softmax_in_fp32, as
    GLM-4.7-Flash's bridge leaves it, fusions/fused_softmax.py:336-340 casts them back to the bf16 it was built for).
    Restores the original tensors, dtypes and flags on exit (no rounding)."""
    configs: dict[int, tuple[Any, Any]] = {}
    softmax: list[tuple[Any, tuple[bool, bool, bool]]] = []
    try:
        for chunk in model:
            for module in chunk.modules():
                config = getattr(module, "config", None)
                if getattr(config, "params_dtype", torch.float32) != torch.float32 and id(config) not in configs:
                    configs[id(config)] = (config, config.params_dtype)
                    config.params_dtype = torch.float32
                if getattr(module, "input_in_float16", False):
                    softmax.append((module, (module.input_in_fp16, module.input_in_bf16, module.input_in_float16)))
                    module.input_in_fp16 = module.input_in_bf16 = module.input_in_float16 = False
        with fp32_forward(model, shared=_tied(model), whole=whole):
            yield
    finally:
        for config, dtype in configs.values():
            config.params_dtype = dtype
        for module, (fp16, bf16, float16) in softmax:
            module.input_in_fp16, module.input_in_bf16, module.input_in_float16 = fp16, bf16, float16


def _tied(model: list[MegatronModule]) -> list[Any]:
    """The embedding weights the output layer reads too (GPTModel/MambaModel with tied embeddings, or such a language
    model inside a vision / audio wrapper, however deep: Qwen2.5-Omni's thinker.language_model)."""
    out: list[Any] = []
    for chunk in model:
        for module in _unwrap(chunk).modules():
            if not getattr(module, "share_embeddings_and_output_weights", False):
                continue
            share = getattr(module, "shared_embedding_or_output_weight", None)
            weight = share() if callable(share) else None
            if weight is not None and not any(weight is w for w in out):
                out.append(weight)
    return out


def model_groups(model: Any) -> Any:
    """The model's ProcessGroupCollection: its own, else its language model's (a vision-language wrapper such as the
    bridge's Qwen25VLModel keeps none of its own)."""
    groups = getattr(model, "pg_collection", None)
    if groups is None and getattr(model, "language_model", None) is not None:
        groups = getattr(model.language_model, "pg_collection", None)
    if groups is None:
        groups = ProcessGroupCollection.use_mpu_process_groups()
    return groups


def megatron_logits(
    ctx: RankContext, tokens: Any, whole: bool = False, extra: dict[str, Any] | None = None
) -> Any | None:
    """Collective fp32 forward of this rank's chunks; full-vocab logits [B, S, V] on last-stage ranks, else None.

    Pipeline order: chunk 0 on stages 0..P-1, then chunk 1 on stages 0..P-1, ... (a virtual pipeline's interleave);
    hidden states [S, B, H] pass stage to stage, from the last stage back to the first between chunks. The
    embedding is chunk 0 of stage 0's, the final norm and output layer the last chunk of the last stage's.
    `whole`: upcast the whole chunk up front instead of block by block (the same bits, more memory). `extra`: more
    forward keywords (a vision-language model's pixel_values and image_grid_thw, given to every stage)."""
    gpt = _unwrap(ctx.model[0])
    groups = model_groups(gpt)
    pp, tp = groups.pp, groups.tp
    pp_ranks = dist.get_process_group_ranks(pp) if ctx.world > 1 else [0]
    stage = pp_ranks.index(ctx.rank)
    device = next(gpt.parameters()).device
    tokens = tokens.to(device)
    positions = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens)
    with upcast_fp32(ctx.model, whole=whole), torch.no_grad():
        was_training = [c.training for c in ctx.model]
        for chunk in ctx.model:
            chunk.eval()
        try:
            stages, chunks = len(pp_ranks), len(ctx.model)
            shape = (tokens.shape[1], tokens.shape[0], gpt.config.hidden_size)  # [s, b, h] between stages
            failed: Exception | None = None
            for index, chunk in enumerate(ctx.model):
                module = _unwrap(chunk)
                if stage > 0 or index > 0:  # input from the previous stage (the last one, between chunks)
                    hidden = torch.empty(shape, dtype=torch.float32, device=device)
                    dist.recv(hidden, src=pp_ranks[stage - 1])  # stage 0's previous stage is pp_ranks[-1]
                    module.set_input_tensor(hidden)
                if failed is None:
                    try:
                        more = {k: v.to(device) for k, v in (extra or {}).items()}
                        out = module(input_ids=tokens, position_ids=positions, attention_mask=None, **more)
                        if isinstance(
                            out, tuple
                        ):  # (logits, loss_mask): the Gemma 3 VL wrapper, modeling_gemma3_vl.py:204
                            out = out[0]
                    except Exception as exc:  # noqa: BLE001 - re-raised once the pipeline has drained
                        failed = exc
                if stage < stages - 1 or index < chunks - 1:  # a failed stage sends NaN: the next one must not wait
                    sent = torch.full(shape, float("nan"), device=device) if failed is not None else out.float()
                    dist.send(sent.contiguous(), dst=pp_ranks[(stage + 1) % stages])
            if failed is not None:
                raise failed
            if stage < stages - 1:
                return None
        finally:
            for chunk, training in zip(ctx.model, was_training):
                chunk.train(training)
    out = out.float()
    if dist.is_initialized() and dist.get_world_size(tp) > 1:
        parts = [torch.empty_like(out) for _ in range(dist.get_world_size(tp))]
        dist.all_gather(parts, out.contiguous(), group=tp)
        out = torch.cat(parts, dim=-1)
    return out.cpu()


def hf_logits(path: Any, tokens: Any, device: str = "cpu") -> Any:
    """fp32 logits [B, S, V] of the HF model loaded whole by transformers from the checkpoint (`eager()` kernels).

    Loaded in fp32 on `device` (bf16 -> fp32 is exact), as `hf_image_logits`: a model loaded in its bf16 computes the
    buffers it derives at init in bf16 and no later upcast restores them (Gemma 4's embed_scale, sqrt(hidden), rounds
    from 5.6569 to 5.6562 for hidden 32: 1e-4 on tiny:gemma4-vl's logits). The fallback of a model transformers cannot
    stream, so memory holds the whole model in fp32."""
    auto = lm_auto_class(transformers.AutoConfig.from_pretrained(path))
    model = auto.from_pretrained(path, dtype=torch.float32, **eager())
    model.to(device).eval()
    with torch.no_grad():
        return logits_module(model)(input_ids=tokens.to(device)).logits.float().cpu()


def hf_image_logits(path: Any, inputs: dict[str, Any], device: str = "cpu") -> Any:
    """fp32 logits [1, S, V] of the HF vision-language model on `inputs` (convcheck.oracles.image_input): loaded whole
    by transformers in fp32 (bf16 -> fp32 is exact), `eager()` kernels, the image through its vision tower."""
    auto = lm_auto_class(transformers.AutoConfig.from_pretrained(path))
    model = auto.from_pretrained(path, dtype=torch.float32, **eager())
    model.to(device).eval()
    with torch.no_grad():
        return logits_module(model)(**{k: v.to(device) for k, v in inputs.items()}).logits.float().cpu()


IMAGE_KEYS = ("pixel_values", "image_grid_thw", "image_position_ids")
"""The image inputs the Megatron forward takes beside the input ids (it finds the image tokens by image_token_id);
Gemma 4's tower reads image_position_ids where Qwen's read image_grid_thw; Gemma 3's has no grid, and builds its
bidirectional image mask from the ids (modeling_gemma3_vl.py _compute_attention_biases)."""


def image_megatron(ctx: RankContext) -> tuple[dict[str, Any] | None, list[Any], str]:
    """Collective: every rank's Megatron logits on one tiny image (vision tower, merger, deepstack mergers and language
    model together) for a vision-language checkpoint with an image processor, gathered as (logits, error, site); the
    inputs (None when there is no image pass) and why it did not run ("" when it did). At PP > 1 every stage gets the
    image inputs: the first stage's vision tower and deepstack mergers read pixel_values, every stage's mrope
    positions read image_grid_thw (qwen_vl/modelling_qwen3_vl/model.py get_rope_index)."""
    from convcheck.oracles.image_input import image_inputs

    inputs = image_inputs(ctx.checkpoint.path, ctx.checkpoint.config)
    if inputs is None:
        return None, [], ""
    error, where = None, None
    with tracking(ctx.model, ctx.global_name) as site:
        try:
            logits = megatron_logits(ctx, inputs["input_ids"], whole=True,
                                     extra={k: inputs[k] for k in IMAGE_KEYS if k in inputs})  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a crashing forward is a finding
            logits, error, where = None, f"{one_line(exc)} (at {raised_at(exc)})", site()
    return inputs, ctx.gather((logits, error, where)), ""


def image_compare(ctx: RankContext, inputs: dict[str, Any], gathered: list[Any]) -> tuple[list[Finding], dict, int]:
    """Reporter: the image pass's findings (named `logits[image]`, `greedy-tokens[image]`, a failed forward's parameter
    with `[image]`), its `image_*` metrics and the logits it checked."""
    from convcheck.oracles.image_input import describe

    findings = []
    for rank, (_, error, where) in enumerate(gathered):
        if error:
            failed = forward_failed(rank, error, where)
            findings.append(replace(failed, tensor=f"{failed.tensor}[image]"))
    outputs = [t for t, _, _ in gathered if t is not None]
    metrics: dict[str, Any] = {"image_input": describe(inputs)}
    if not outputs:
        return findings, metrics, 0
    try:
        hf = hf_image_logits(ctx.checkpoint.path, inputs, device=hf_device(ctx))
    except Exception as exc:  # noqa: BLE001 - reported, the Megatron side already ran
        return [*findings, Finding(tensor="<hf forward>[image]", kind="hf-failed", message=one_line(exc))], metrics, 0
    more, measured = compare(outputs[0], hf)
    findings += [replace(f, tensor=f"{f.tensor}[image]") for f in more]
    metrics.update({f"image_{k}": measured[k] for k in ("max_abs_err", "max_rel_err", "greedy_match") if k in measured})
    return findings, metrics, hf.numel()


def hf_reference(path: Any, tokens: Any, device: str = "cpu") -> tuple[Any, str]:
    """The HF logits and how they were made: streamed one block at a time (convcheck.oracles.hf_stream), or, where
    this transformers cannot stream the model, loaded whole (`hf_logits`). Both are bitwise the fp32 model's."""

    try:
        return streamed_logits(str(path), tokens, device=device), "streamed"
    except Exception as exc:  # noqa: BLE001 - the reference falls back; the verdict says so
        return hf_logits(path, tokens, device=device), f"whole (not streamed: {one_line(exc)[:160]})"


def compare(megatron: Any, hf: Any) -> tuple[list[Finding], dict[str, Any]]:
    """Findings and metrics for megatron [B, S, Vp] vs hf [B, S, V] (padded vocab columns are not compared)."""
    vocab = hf.shape[-1]
    if megatron.shape[:-1] != hf.shape[:-1] or megatron.shape[-1] < vocab:
        msg = f"Megatron logits {list(megatron.shape)}, HF logits {list(hf.shape)}"
        return [Finding(tensor="logits", kind="shape", message=msg)], {}
    meg = megatron[..., :vocab]
    diff = (meg - hf).abs()
    flat = int(diff.nan_to_num(float("inf")).argmax())
    index = [flat // (diff.shape[1] * vocab), (flat // vocab) % diff.shape[1], flat % vocab]
    max_abs = float(diff.reshape(-1)[flat])
    scale = float(hf.abs().max())
    max_rel = max_abs / scale if scale > 0 else float("inf")
    greedy_meg, greedy_hf = meg.argmax(-1), hf.argmax(-1)
    agree = greedy_meg == greedy_hf
    metrics = {
        "max_abs_err": max_abs,
        "abs_tol": ABS_TOL,
        "max_rel_err": max_rel,
        "rel_tol": REL_TOL,
        "greedy_match": f"{int(agree.sum())}/{agree.numel()}",
        "tokens": f"{hf.shape[0]}x{hf.shape[1]}",
        "seed": SEED,
    }
    findings = []
    if not (max_abs <= ABS_TOL and max_rel <= REL_TOL):
        b, s, v = index
        findings.append(
            Finding(
                tensor="logits",
                kind="logits-differ",
                message=f"max abs error {max_abs:.3g} (tol {ABS_TOL:g}), relative {max_rel:.3g} (tol {REL_TOL:g}); "
                f"worst at [batch {b}, position {s}, token {v}]: "
                f"megatron {float(meg[b, s, v])!r}, hf {float(hf[b, s, v])!r}",
                detail={"max_abs_err": max_abs, "max_rel_err": max_rel, "index": index},
            )
        )
    if not bool(agree.all()):
        b, s = (int(i) for i in (~agree).nonzero()[0])
        findings.append(
            Finding(
                tensor="greedy-tokens",
                kind="greedy-differs",
                message=f"{int((~agree).sum())}/{agree.numel()} positions pick another token; first at [batch {b}, "
                f"position {s}]: megatron {int(greedy_meg[b, s])}, hf {int(greedy_hf[b, s])}",
                detail={"index": [b, s], "megatron": int(greedy_meg[b, s]), "hf": int(greedy_hf[b, s])},
            )
        )
    return findings, metrics


def hf_device(ctx: RankContext) -> str:
    """Where rank 0 runs the HF reference: its own device (the GPU of a CUDA run), so the host holds no model."""
    params = (p for chunk in ctx.model for p in chunk.parameters())
    first = next(params, None)
    return str(first.device) if first is not None and first.device.type == "cuda" else str(torch.device("cpu"))


def forward_failed(rank: int, error: str, where: ForwardSite | None) -> Finding:
    """A Megatron forward that raised on `rank`, named by the parameter of the module it raised in (where known)."""
    if where is None:
        return Finding(tensor="<megatron forward>", kind="forward-failed", message=f"rank {rank}: {error}",
                       detail={"rank": rank})  # fmt: skip
    return Finding(
        tensor=where.tensor,
        kind="forward-failed",
        message=f"rank {rank}: {error}, {where.describe()}",
        detail={"rank": rank, "module": where.module, "module_class": where.kind, "params": where.params,
                "inputs": where.inputs},
    )  # fmt: skip


def run(ctx: RankContext) -> OracleVerdict | None:
    """Collective: every rank runs its part of the Megatron forward; rank 0 runs HF and compares."""
    config = ctx.checkpoint.config
    tokens = fixed_tokens(vocab_size(config), placeholder_ids(config))
    error, cpu_limit, where = None, False, None
    with tracking(ctx.model, ctx.global_name) as site:
        try:
            logits = megatron_logits(ctx, tokens)
        except Exception as exc:  # noqa: BLE001 - a crashing forward is a finding, not a crash of convcheck
            logits, error = None, f"{one_line(exc)} (at {raised_at(exc)})"
            cpu_limit = ctx.device == "cpu" and needs_cuda(exc)
            where = site()
    gathered = ctx.gather((logits, error, cpu_limit, where))
    image, image_gathered, image_skipped = image_megatron(ctx)
    if not ctx.is_reporter:
        return None
    limited = [(r, e) for r, (_, e, cpu, _) in enumerate(gathered) if cpu]
    if limited:  # convcheck has no CPU shim for this forward: a gap of convcheck, not a bridge bug
        rank, first = limited[0]
        reason = (
            f"the Megatron forward calls CUDA where convcheck has no CPU shim (rank {rank}: {first}); use --device cuda"
        )
        return OracleVerdict(name=NAME, checked=0, unit="logits", not_covered=reason)
    findings = [forward_failed(r, e, where) for r, (_, e, _, where) in enumerate(gathered) if e]
    gathered = [(t, e) for t, e, _, _ in gathered]
    outputs = [(r, t) for r, (t, _) in enumerate(gathered) if t is not None]
    if not outputs:
        return make_verdict(NAME, checked=0, findings=findings, unit="logits")
    # Copies inside one TP group come from one gather and must be identical; separate data-parallel replicas
    # (e.g. EP x ETP without TP) reduce in their own order, so each is held to the numeric thresholds instead.
    replicas: dict[int, tuple[int, Any]] = {}
    for r, t in outputs:
        ref_rank, ref = replicas.setdefault(r // ctx.layout.tp, (r, t))
        if ref_rank != r and (t.shape != ref.shape or not bool((int_view(t) == int_view(ref)).all())):
            findings.append(
                Finding(
                    tensor="logits",
                    kind="ranks-disagree",
                    message=f"rank {r}'s logits differ from rank {ref_rank}'s (same TP group)",
                )
            )
    try:
        hf, how = hf_reference(ctx.checkpoint.path, tokens, device=hf_device(ctx))
    except Exception as exc:  # noqa: BLE001 - reported, the Megatron side already ran
        findings.append(Finding(tensor="<hf forward>", kind="hf-failed", message=one_line(exc)))
        return make_verdict(NAME, checked=0, findings=findings, unit="logits")
    worst: dict[str, Any] = {}
    for r, t in replicas.values():
        more, metrics = compare(t, hf)
        findings += [f for f in more if f.to_dict() not in [g.to_dict() for g in findings]]
        if not worst or metrics.get("max_abs_err", 0) > worst.get("max_abs_err", 0):
            worst = {**metrics, "worst_rank": r}
    worst["replicas"] = len(replicas)
    worst["hf_reference"] = how
    image_findings, image_metrics, image_checked = (
        image_compare(ctx, image, image_gathered) if image is not None else ([], {}, 0)
    )
    if image_skipped:
        image_metrics["image"] = image_skipped
    return make_verdict(NAME, checked=hf.numel() * len(replicas) + image_checked, findings=findings + image_findings,
                        unit="logits", metrics={**worst, **image_metrics})  # fmt: skip
