"""Keyed digest of a tensor's bytes computed on its own device, a chunk at a time (no host copy, no full-size temp).

The bytes are read as signed 16-bit words; each chunk of WORDS words is folded by LANES integer linear sums under
fixed keys in [0, 2**KEY_BITS), computed as one float64 matrix product (every partial sum is an integer below
2**53, so the product is exact in any summation order, on any device). The chunk sums go through sha256 with the
byte count and an odd tail byte. For a chunk that differs, one lane's sum matches with probability at most
2**-KEY_BITS (fix every key but one at a differing word: one value of it at most cancels), so all lanes at most
2**-(LANES * KEY_BITS) = 2**-78: a cross-rank equality check, not a signature against an adversary.
"""

from __future__ import annotations

import hashlib
from typing import Any

WORDS = 1 << 12
"""16-bit words per chunk (one key per word position, per lane)."""
LANES = 3
KEY_BITS = 26
"""|word| <= 2**15, key < 2**26, 2**12 words: every partial sum stays below 2**53, exact in float64."""
STEP_BYTES = {"cpu": 8 << 20, "cuda": 256 << 20}
"""Bytes of float64 words converted at once per device type (a few MiB on the CPU, much more on a GPU)."""
_TAG = b"convcheck-fold-v2"
_keys: dict[str, Any] = {}


def _lanes(device: Any) -> Any:
    """The lanes' keys, float64 [LANES, WORDS], integers in [0, 2**KEY_BITS), from sha256 in counter mode."""
    import numpy as np
    import torch

    key = str(device)
    if key not in _keys:
        count = LANES * WORDS
        raw = b"".join(hashlib.sha256(_TAG + i.to_bytes(4, "little")).digest() for i in range(count * 8 // 32))
        words = torch.from_numpy(np.frombuffer(raw, dtype="<i8").copy()) & ((1 << KEY_BITS) - 1)
        _keys[key] = words.reshape(LANES, WORDS).to(torch.float64).to(device)
    return _keys[key]


def _flat_bytes(tensor: Any) -> Any:
    """The tensor's bytes as a flat uint8 tensor on its device, 2-byte aligned (copied only when it must be)."""
    import torch

    from convcheck.bits import int_view

    data = int_view(tensor).view(torch.uint8)
    if data.data_ptr() % 2:
        data = data.clone()
    return data


def digest(tensor: Any) -> str:
    """Hex digest of `tensor`'s raw bytes (dtype and shape are not part of it: record them next to it)."""
    import torch

    data = _flat_bytes(tensor)
    whole = data.numel() // 2
    sums = chunk_sums(data[: whole * 2].view(torch.int16))
    h = hashlib.sha256(_TAG + data.numel().to_bytes(8, "little"))
    h.update(sums.to(torch.int64).cpu().numpy().tobytes())
    h.update(data[whole * 2 :].cpu().numpy().tobytes())
    return h.hexdigest()


def chunk_sums(words: Any) -> Any:
    """float64 [LANES, chunks] on the words' device: each chunk's keyed sums (integers, exact); the last chunk
    zero-padded."""
    import torch

    keys = _lanes(words.device)
    rows = max(1, STEP_BYTES.get(words.device.type, STEP_BYTES["cuda"]) // (WORDS * 8))
    whole = words.numel()
    chunks, full = -(-whole // WORDS), whole // WORDS
    sums = torch.empty((LANES, chunks), dtype=torch.float64, device=words.device)
    buf = torch.empty((min(rows, max(chunks, 1)), WORDS), dtype=torch.float64, device=words.device)
    if full:
        grid = words[: full * WORDS].view(full, WORDS)
        for a in range(0, full, rows):
            block = buf[: min(rows, full - a)]
            block.copy_(grid[a : a + block.shape[0]])
            torch.mm(keys, block.t(), out=sums[:, a : a + block.shape[0]])
    if chunks > full:  # zero words add nothing (the byte count is hashed)
        last = buf[:1].zero_()
        last[0, : whole - full * WORDS].copy_(words[full * WORDS :])
        torch.mm(keys, last.t(), out=sums[:, full:])
    return sums
