"""What a written HF folder holds besides its weights, against the source: config.json and generation_config.json
as transformers reads them, the tokenizer files carried over, and the logits transformers computes from the folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import transformers

from convcheck.compare.bits import bytes_equal, first_difference, unravel_index
from convcheck.errors import one_line
from convcheck.oracles.config import flatten, same_value
from convcheck.verdict import Finding

IGNORED_FIELDS = frozenset({"transformers_version", "_name_or_path"})
"""Fields a re-save rewrites by design (the writer's transformers version, the path it was loaded from)."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
"""Files of a tokenizer a checkpoint may ship; each the source has must be in the written folder."""
PROBE_TEXT = "convcheck w1 w7 w42 checks: 12 weights, tied heads, and <unk> ünïcödé."


def config_findings(source: Path, written: Path, label: str) -> list[Finding]:
    """config.json (and generation_config.json when the source has one) read back by transformers equal the source's,
    field by field (nested fields with dots)."""
    found = _same_fields("config.json", transformers.AutoConfig, source, written, label)
    if (source / "generation_config.json").exists():
        found += _same_fields("generation_config.json", transformers.GenerationConfig, source, written, label)
    return found


def _same_fields(file: str, cls: Any, source: Path, written: Path, label: str) -> list[Finding]:
    if not (written / file).exists():
        return [Finding(tensor=file, kind="file-dropped", message=f"{label}: not written; the source has it")]
    want = _fields(cls, source)
    try:
        got = _fields(cls, written)
    except Exception as exc:  # noqa: BLE001 - an unreadable written file is the finding
        return [
            Finding(tensor=file, kind="unreadable", message=f"{label}: transformers cannot read it: {one_line(exc)}")
        ]
    out = []
    for key in sorted(set(want) | set(got)):
        a, b = want.get(key, "<absent>"), got.get(key, "<absent>")
        if not same_value(a, b):
            message = f"{label}: {key} is {b!r}, the source's is {a!r}"
            out.append(Finding(tensor=f"{file}:{key}", kind="field-differs", message=message))
    return out


def _fields(cls: Any, folder: Path) -> dict[str, Any]:
    """The fields transformers reads from `folder`, nested ones spelled with dots (the config oracle's flatten)."""
    data = cls.from_pretrained(str(folder)).to_dict()
    return {k: v for k, v in flatten(data).items() if k not in IGNORED_FIELDS}


def tokenizer_findings(source: Path, written: Path, label: str) -> tuple[list[Finding], list[str]]:
    """(findings, files the writer added that the source has not): every tokenizer file of the source is written,
    and the written tokenizer has the source's vocabulary and encodes a probe text to the same ids."""
    have = [name for name in TOKENIZER_FILES if (source / name).exists()]
    added = [name for name in TOKENIZER_FILES if (written / name).exists() and name not in have]
    out = [
        Finding(tensor=name, kind="file-dropped", message=f"{label}: not written; the source has it")
        for name in have
        if not (written / name).exists()
    ]
    if not have or out:
        return out, added

    want = transformers.AutoTokenizer.from_pretrained(str(source))
    try:
        got = transformers.AutoTokenizer.from_pretrained(str(written))
    except Exception as exc:  # noqa: BLE001
        return [Finding(tensor="tokenizer", kind="unreadable", message=f"{label}: {one_line(exc)}")], added
    if want.get_vocab() != got.get_vocab():
        wrong = sorted(set(want.get_vocab().items()) ^ set(got.get_vocab().items()))[:1]
        message = f"{label}: the vocabulary differs from the source's (first differing entry {wrong})"
        out.append(Finding(tensor="tokenizer", kind="vocab-differs", message=message))
    elif want(PROBE_TEXT)["input_ids"] != got(PROBE_TEXT)["input_ids"]:
        message = f"{label}: encodes {PROBE_TEXT!r} to other ids than the source's tokenizer"
        out.append(Finding(tensor="tokenizer", kind="encoding-differs", message=message))
    return out, added


def logits_check(
    source: Path, written: Path, label: str, vocab: int, exact: bool, device: str = "cpu"
) -> tuple[list[Finding], float]:
    """(findings, max abs error) of transformers' fp32 logits of the written folder against the source's on the
    logits oracle's fixed tokens, both on `device`; `exact`: bitwise equality is required (same bytes and config give
    the same bits)."""
    from convcheck.oracles.logits import fixed_tokens, hf_reference

    tokens = fixed_tokens(vocab)
    want, _ = hf_reference(source, tokens, device=device)
    try:
        got, _ = hf_reference(written, tokens, device=device)
    except Exception as exc:  # noqa: BLE001 - a folder transformers cannot load is the finding
        return [Finding(tensor="<logits>", kind="unloadable", message=f"{label}: {one_line(exc)}")], float("nan")
    if want.shape != got.shape:
        message = f"{label}: logits of shape {list(got.shape)}, the source's {list(want.shape)}"
        return [Finding(tensor="<logits>", kind="logits-shape", message=message)], float("nan")
    error = float((want - got).abs().max()) if want.numel() else 0.0
    if not exact or bytes_equal(want, got):
        return [], error
    count, first, expected, actual = first_difference(want, got)
    index = list(unravel_index(first, tuple(want.shape)))
    message = (
        f"{label}: transformers' fp32 logits of the folder differ from the source's in {count} places "
        f"(max abs {error:.3g}); first at {index}: got {actual}, expected {expected}"
    )
    return [Finding(tensor="<logits>", kind="logits-differ", message=message)], error
