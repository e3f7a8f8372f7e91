"""Settings a checkpoint does not carry but training setups turn on, as `--hook` functions that exercise bridge paths
the HF defaults never reach: `convcheck verify --model tiny:qwen3 --tp 2 --hook convcheck.knobs:pad_vocab`."""

from __future__ import annotations

from convcheck.mutants import alter_provider


def pad_vocab() -> None:
    """should_pad_vocab on: embedding and output rows padded to a multiple of make_vocab_size_divisible_by x TP
    (152 -> 160 at TP2 for the tiny fixtures); the import must pad and the export must drop the padding again."""
    alter_provider(lambda p: setattr(p, "should_pad_vocab", True))
