"""Oracle descriptions: distckpt, reshard, save, quant, quant_import."""

from __future__ import annotations

import json
from pathlib import Path

from convcheck.errors import BadInput, one_line
from convcheck.oracles.base import OracleInfo, OracleOption
from convcheck.quant.catalog import FORMATS, parse_block, parse_quantizer

SAVE_DTYPES = ("bf16", "fp16", "fp32")
"""`--save-dtype` spellings (convcheck.ckpt.written.CAST_DTYPES maps each to its dtypes)."""


def _config_file(value: str) -> str:
    """--quant-config: a JSON file holding a quantization_config (or a config.json that has one), made absolute."""
    path = Path(value).expanduser().resolve()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"--quant-config {value}: {one_line(exc)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("quantization_config", data), dict):
        raise BadInput(f"--quant-config {value}: not a JSON object (a quantization_config or a config.json)")
    return str(path)


DISTCKPT = OracleInfo(
    name="distckpt",
    module="convcheck.oracles.distckpt",
    proves="the model saved with megatron-core dist_checkpointing (torch_dist) at the run's layout and restored into "
    "a fresh NaN-filled model at --resume-layout (a separate launch each, TP1 by default) restores every "
    "sharded key and every element, and the HF exports at both layouts are byte-identical to the source; "
    "on CUDA also that every Adam moment and fp32 main param of the distributed optimizer stays with its "
    "element",
    does_not_prove="other save strategies (async, fully parallel) or a trainer's own resume logic (iteration, RNG, "
    "data state); on a CPU run the optimizer state (megatron-core's DDP and distributed optimizer are "
    "CUDA-only there: reported as not run)",
    default=False,
)

RESHARD = OracleInfo(
    name="reshard",
    module="convcheck.oracles.reshard",
    proves="for each target layout (every --target-tp x --target-ep x --target-etp), every target rank's shard of "
    "every parameter, assembled over torch.distributed from only the slices of the trainer ranks' loaded shards "
    "its plan names (roles from the bridge mapping classes: fused qkv with GQA, kv replication and an output "
    "gate, gate|up, GDN sections (in_proj, conv1d), column/vocab, row, replicated (a zero-centered norm's offset "
    "added back), experts per EP rank, split over expert TP on either side), equals bitwise the "
    "shard computed from the HF tensors; each target rank gets exactly the parameters the target layout gives "
    "it; the plan covers every element exactly once; no target rank moves more than its shard's bytes; the "
    "bridge's role agrees with megatron-core's",
    does_not_prove="an inference engine's own loader or kernels, quantized or fused-MoE (3-D w13/w2) target "
    "layouts, --experts te-grouped; the target ranks are simulated on the trainer ranks",
    default=False,
)

SAVE = OracleInfo(
    name="save",
    module="convcheck.oracles.save",
    proves="the folders the bridge's own writer makes at this layout (save_hf_pretrained on rank 0, save_hf_weights "
    "with distributed_save across ranks, optionally a weight_dtype cast) hold every source tensor once, in the "
    "source's shard, with its dtype, shape and bytes (or exactly its cast), an index true to the shards, the "
    "source's config, generation config and tokenizer files, and load in transformers to the source's logits",
    does_not_prove="writers other than the bridge's (see the sync oracles), remote-code files, nor writes to "
    "storage shared by several machines; opt-in: it exports twice and loads the model in transformers twice, "
    "0.86x the bare roundtrip on one H200 at real size (bench/bench_realsize.py --runs save)",
    default=False,
    options=(
        OracleOption(
            flag="--save-dtype",
            choices=SAVE_DTYPES,
            help="write with the bridge's weight_dtype cast to this dtype and prove every float tensor is exactly "
            "the source's cast (default: no cast, bytes as the source).",
        ),
    ),
)

QUANT = OracleInfo(
    name="quant",
    module="convcheck.oracles.quant",
    proves="the bridge's quantized export (export_hf_weights_quant with the named quantizer as quant_fn, at this "
    "layout) sends, for every HF tensor the target's quantization_config quantizes (2-D weights, none its ignore "
    "patterns name, never the embedding, LM head or routers), exactly the bytes and scales the quantizer gives the "
    "bridge's bf16 export of the whole tensor, bitwise; every scale present, on the block grid, finite and positive; "
    "every other tensor unquantized and bitwise the bf16 export; no name twice or extra; dequantize(quantize(x)) "
    "within the format's rounding bound of x (measured)",
    does_not_prove="that a rollout engine loads or computes with these bytes correctly, the ModelOpt NVFP4 export "
    "(export_hf_weights_modelopt: not-covered), importing FP8 checkpoints, nor quantizers convcheck does not name; "
    "opt-in: a bf16 drain (spared where an earlier oracle proved the export equals the source) and a quantized one",
    default=False,
    options=(
        OracleOption(
            flag="--quantizer",
            help=f"the quantizer the export is proved against: {', '.join(FORMATS)}, or FILE.py:FUNC called as the "
            "bridge calls quant_fn(weight, block) -> (float8_e4m3fn weight, float32 scale per block) "
            "(default fp8-block; docs/quant.md).",
            metavar="NAME|FILE.py:FUNC",
            check=parse_quantizer,
            default="fp8-block",
        ),
        OracleOption(
            flag="--quant-block",
            help="the block width (rows and columns of 2-D blocks, columns of 1-row ones; default the format's own).",
            kind=int,
            metavar="N",
            check=parse_block,
        ),
        OracleOption(
            flag="--quant-bound",
            help="where dequantize(quantize(x)) is measured against the format's bound: every quantized tensor, or "
            "(sample, the default for the built-in quantizers, whose bound tests/test_quant_reference.py holds) the "
            "first 128 rows of the first tensor of each shape on each rank; a FILE.py:FUNC quantizer is measured on "
            "every tensor.",
            choices=("sample", "every"),
            default="sample",
        ),
        OracleOption(
            flag="--quant-config",
            help="the target's quantization_config (a JSON file, or a config.json holding one; default the "
            "checkpoint's own, else every 2-D weight but the embedding, LM head and routers).",
            metavar="FILE",
            check=_config_file,
        ),
    ),
)

QUANT_IMPORT = OracleInfo(
    name="quant-import",
    module="convcheck.oracles.quant_import",
    proves="the bridge's import (load_hf_weights) of an FP8 block checkpoint in the published layout (float8_e4m3fn "
    "weight + float32 weight_scale_inv per 128 x 128 block, quantization_config quant_method fp8) fills every "
    "Megatron parameter, bitwise, with what its import of the reference dequantization bf16(float32(q) * scale) "
    "fills it with, at this layout; a checkpoint loaded as if bf16 (the fp8 values without their scales) is named so. "
    "From a bf16 checkpoint the FP8 one is written with the named quantizer; an FP8 checkpoint is read as it is",
    does_not_prove="that the bridge's bf16 import is right (roundtrip and mapping prove that), block sizes other than "
    "128, FP8 formats other than the 2-D block one (per-tensor, per-channel, MXFP8, NVFP4); opt-in: three imports "
    "of the model and a checkpoint written on rank 0",
    default=False,
    options=(
        OracleOption(
            flag="--import-quantizer",
            help="the reference quantizer that writes the FP8 checkpoint from a bf16 source (fp8-block: slime / "
            "verl / DeepSeek-V3, fp8-ue8m0: power-of-two scales; default fp8-block; an FP8 source is read as it is).",
            choices=("fp8-block", "fp8-ue8m0"),
            default="fp8-block",
        ),
    ),
)
