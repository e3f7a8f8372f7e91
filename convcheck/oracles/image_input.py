"""One tiny fixed image as a vision-language checkpoint's processor makes it, for the logits oracle's image pass.

The image is 16x16 RGB with seeded random pixels, made into `pixel_values` `[patches, C * T * P * P]` and
`image_grid_thw` `[1, 3]` with the settings of the checkpoint's preprocessor_config.json (patch, merge and temporal
sizes, mean and std) by `patchify`, the arithmetic of transformers' Qwen2VLImageProcessor (image_processing_qwen2_vl.py
_preprocess: rescale, normalize, the frame repeated to the temporal patch, the patch reshape in merge order). Its own
classes need PIL or torchvision, which convcheck's environment does not install; a 16x16 image needs no resize.
The input ids `[1, SEQ]` are fixed random text ids with `<vision_start>`, one
`<image_pad>` per merged patch and `<vision_end>` inside, as a processor's chat template places them.

A Gemma 4 vision tower (a vision_config with pooling_kernel_size) gets its own processor's inputs instead
(`gemma4_image_inputs`): a GEMMA4_SIDE x GEMMA4_SIDE image as `pixel_values` `[1, patches, P * P * 3]` and
`image_position_ids` `[1, patches, 2]`, the arithmetic of transformers' Gemma4ImageProcessor, and `<|image>`, one
`<|image|>` per pooled soft token and `<image|>` in the ids.

A Gemma 3 checkpoint (preprocessor_config.json names Gemma3ImageProcessor) gets its own: the image is the tower's
`image_size` square (no resize), rescaled and normalized as Gemma3ImageProcessor does (1/255, mean / std from the
settings), `pixel_values` `[1, 3, S, S]`; the ids hold `<start_of_image>`, mm_tokens_per_image `<image_soft_token>`s and
`<end_of_image>`, and `token_type_ids` (1 at the soft tokens) as Gemma3Processor returns them: HF's image tokens attend
to each other bidirectionally only when they are given (modeling_gemma3.py Gemma3Model.forward).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

SEED = 4321
"""Seed of the pixels and the surrounding text ids (torch.Generator, CPU)."""
SIDE = 16
"""Image height and width in pixels."""
SEQ = 16
"""Input length; the image's tokens sit after the first two text tokens."""
PROCESSOR = "preprocessor_config.json"


def image_inputs(path: str | Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """`input_ids` [1, SEQ], `pixel_values`, `image_grid_thw` and `mm_token_type_ids` [1, SEQ] (1 at image tokens)
    for `config` (a config.json dict); None when the checkpoint is not a vision-language one with an image processor."""
    if isinstance(config.get("vision_config"), dict) and "pooling_kernel_size" in config["vision_config"]:
        return gemma4_image_inputs(path, config)
    if "vision_config" in config and (Path(path) / PROCESSOR).is_file():
        settings = json.loads((Path(path) / PROCESSOR).read_text())
        if settings.get("image_processor_type") == GEMMA3_PROCESSOR:
            return gemma3_image_inputs(config, settings)
    ids = {key: config.get(key) for key in ("image_token_id", "vision_start_token_id", "vision_end_token_id")}
    if "vision_config" not in config or None in ids.values() or not (Path(path) / PROCESSOR).is_file():
        return None
    gen = torch.Generator().manual_seed(SEED)
    pixels = torch.randint(0, 256, (SIDE, SIDE, 3), generator=gen, dtype=torch.uint8)
    settings = json.loads((Path(path) / PROCESSOR).read_text())
    values, grid = patchify(pixels, settings)
    merge = int(config["vision_config"].get("spatial_merge_size", 1))
    tokens = int(grid.prod()) // (merge * merge)
    vocab = int(config["text_config"]["vocab_size"] if "text_config" in config else config["vocab_size"])
    special = set(ids.values()) | {config.get("video_token_id")}
    text = [int(t) for t in torch.randint(0, vocab, (4 * SEQ,), generator=gen) if int(t) not in special]
    if tokens + 4 > SEQ:
        return None
    body = [ids["vision_start_token_id"], *[ids["image_token_id"]] * tokens, ids["vision_end_token_id"]]
    row = text[:2] + body + text[2 : SEQ - len(body)]
    input_ids = torch.tensor([row], dtype=torch.long)
    return {
        "input_ids": input_ids,
        "pixel_values": values,
        "image_grid_thw": grid,
        "mm_token_type_ids": (input_ids == ids["image_token_id"]).to(torch.int32),
    }


GEMMA3_PROCESSOR = "Gemma3ImageProcessor"


def gemma3_image_inputs(config: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any] | None:
    """`input_ids` [1, SEQ], `pixel_values` [1, 3, S, S] and `token_type_ids` [1, SEQ] for a Gemma 3 VL config.json
    (S: vision_config.image_size; None when the soft tokens do not fit SEQ)."""
    side = int(config["vision_config"]["image_size"])
    boi, eoi, image = (int(config[k]) for k in ("boi_token_index", "eoi_token_index", "image_token_index"))
    tokens = int(config["mm_tokens_per_image"])
    if tokens + 4 > SEQ:
        return None
    gen = torch.Generator().manual_seed(SEED)
    pixels = torch.randint(0, 256, (side, side, 3), generator=gen, dtype=torch.uint8)
    mean = torch.tensor(settings["image_mean"], dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(settings["image_std"], dtype=torch.float32).view(3, 1, 1)
    scale = float(settings.get("rescale_factor", 1 / 255))
    values = ((pixels.permute(2, 0, 1).to(torch.float32) * scale - mean) / std).unsqueeze(0).contiguous()
    vocab = int(config["text_config"]["vocab_size"])
    text = [int(t) for t in torch.randint(0, vocab, (4 * SEQ,), generator=gen) if int(t) not in (boi, eoi, image)]
    body = [boi, *[image] * tokens, eoi]
    input_ids = torch.tensor([text[:2] + body + text[2 : SEQ - len(body)]], dtype=torch.long)
    return {"input_ids": input_ids, "pixel_values": values, "token_type_ids": (input_ids == image).to(torch.long)}


def patchify(pixels: Any, settings: dict[str, Any]) -> tuple[Any, Any]:
    """An image `[H, W, 3]` uint8 (H, W multiples of patch * merge) -> fp32 `pixel_values`
    `[T' * H' * W', 3 * T * P * P]` and `image_grid_thw` `[[T', H', W']]` (T' = 1 for one frame; H' = H / P), rows in
    the vision tower's order: each merge x merge window's patches together."""
    p, m, t = int(settings["patch_size"]), int(settings["merge_size"]), int(settings["temporal_patch_size"])
    mean = torch.tensor(settings["image_mean"], dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(settings["image_std"], dtype=torch.float32).view(3, 1, 1)
    image = (pixels.permute(2, 0, 1).to(torch.float32) * (1 / 255) - mean) / std  # [3, H, W]
    frames = image.unsqueeze(0).repeat(t, 1, 1, 1)  # [T, 3, H, W]: one image fills the temporal patch
    gh, gw = image.shape[1] // p, image.shape[2] // p
    patches = frames.reshape(1, t, 3, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(gh * gw, 3 * t * p * p).contiguous(), torch.tensor([[1, gh, gw]], dtype=torch.long)


GEMMA4_SIDE = 24
"""Gemma 4's image side in pixels: with 4-pixel patches and 3x3 pooling, 6x6 patches pooled to 2x2 soft tokens."""


def gemma4_image_inputs(path: str | Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """`input_ids` [1, SEQ], `pixel_values` [1, N, P * P * 3], `image_position_ids` [1, N, 2] ((x, y) of each patch)
    and `mm_token_type_ids` [1, SEQ] for a Gemma 4 checkpoint (N = (GEMMA4_SIDE / P)^2 patches, no padding patches);
    None without an image processor or where the image does not pool whole."""
    ids = {key: config.get(key) for key in ("image_token_id", "boi_token_id", "eoi_token_id")}
    if None in ids.values() or not (Path(path) / PROCESSOR).is_file():
        return None
    settings = json.loads((Path(path) / PROCESSOR).read_text())
    p, k = int(settings["patch_size"]), int(settings["pooling_kernel_size"])
    if GEMMA4_SIDE % (p * k):
        return None
    gen = torch.Generator().manual_seed(SEED)
    pixels = torch.randint(0, 256, (GEMMA4_SIDE, GEMMA4_SIDE, 3), generator=gen, dtype=torch.uint8)
    image = pixels.permute(2, 0, 1).to(torch.float32) * (1 / 255)  # [3, H, W]; no normalisation
    side = GEMMA4_SIDE // p
    patches = image.reshape(3, side, p, side, p).permute(1, 3, 2, 4, 0).reshape(side * side, p * p * 3)
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    positions = torch.stack([xs, ys], dim=-1).reshape(side * side, 2)
    tokens = side * side // (k * k)
    vocab = int(config["text_config"]["vocab_size"])
    special = {int(v) for key, v in config.items() if key.endswith(("_token_id", "_token_index")) and v is not None}
    text = [int(t) for t in torch.randint(0, vocab, (4 * SEQ,), generator=gen) if int(t) not in special]
    if tokens + 4 > SEQ:
        return None
    body = [ids["boi_token_id"], *[ids["image_token_id"]] * tokens, ids["eoi_token_id"]]
    row = text[:2] + body + text[2 : SEQ - len(body)]
    input_ids = torch.tensor([row], dtype=torch.long)
    return {
        "input_ids": input_ids,
        "pixel_values": patches.unsqueeze(0).contiguous(),
        "image_position_ids": positions.unsqueeze(0).to(torch.long),
        "mm_token_type_ids": (input_ids == ids["image_token_id"]).to(torch.int32),
    }


def describe(inputs: dict[str, Any]) -> str:
    """`1x16 ids, 16 patches (grid 1x4x4), 4 image tokens` (a Gemma 4 image: `1x16 ids, 16 patches, 4 image tokens`;
    a Gemma 3 image: `1x16 ids, image 3x16x16, 4 image tokens`)."""
    if "image_position_ids" in inputs:  # Gemma 4: patches with (x, y) positions
        patches = inputs["pixel_values"].shape[-2]
        return (
            f"{inputs['input_ids'].shape[0]}x{inputs['input_ids'].shape[1]} ids, {patches} patches, "
            f"{int(inputs['mm_token_type_ids'].sum())} image tokens"
        )
    ids = inputs["input_ids"]
    if "image_grid_thw" not in inputs:
        shape = "x".join(map(str, inputs["pixel_values"].shape[1:]))
        return f"{ids.shape[0]}x{ids.shape[1]} ids, image {shape}, {int(inputs['token_type_ids'].sum())} image tokens"
    grid = [int(x) for x in inputs["image_grid_thw"][0]]
    tokens = int(inputs["mm_token_type_ids"].sum())
    return (f"{ids.shape[0]}x{ids.shape[1]} ids, {inputs['pixel_values'].shape[0]} patches "
            f"(grid {'x'.join(map(str, grid))}), {tokens} image tokens")  # fmt: skip
