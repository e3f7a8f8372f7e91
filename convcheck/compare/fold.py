"""Keyed digest of a tensor's bytes computed on its own device, a chunk at a time (no host copy, no full-size temp).

The bytes are read as signed 8-bit integers; each chunk of CHUNK bytes is folded by LANES integer linear sums under
fixed nonzero int8 keys, computed as one int8 matrix product with int32 sums (`torch._int_mm`; |sum| <= 2**14 *
CHUNK = 2**26, exact), or as float64 products where that kernel cannot run (the same integers). Sums of more than
HOST_BYTES are folded again the same way on the device; the last level goes through sha256 with the byte counts.
For a chunk that differs, one lane's sum matches with probability at most 1/255 (fix every key but one at a
differing byte: one of its 255 values at most cancels), so all lanes at most 255**-LANES < 2**-127 per level: a
cross-rank equality check, not a signature against an adversary.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from convcheck.compare.bits import int_view, tensor_sha256

CHUNK = 1 << 12
"""Bytes per chunk (one key per byte position, per lane)."""
LANES = 16
STEP_ROWS = {"cpu": 1 << 11, "cuda": 1 << 13}
"""Chunks per float64 product on the fallback path (8 MiB of bytes on the CPU, 32 MiB on a GPU)."""
HOST_BYTES = 1 << 20
"""Chunk sums larger than this are folded again on their device before the host hashes them (a GPU would
otherwise wait on a 1/64-size copy and its sha256)."""
SMALL_BYTES = 1 << 20
"""A device tensor of at most this many bytes gets a quick digest by sha256 of a host copy, a larger one the fold."""
_TAG = b"convcheck-fold-v3"
_keys: dict[str, Any] = {}


def _lanes(device: Any) -> Any:
    """The keys, int8 [CHUNK, LANES], each nonzero, from sha256 in counter mode (zero bytes skipped)."""
    name = str(device)
    if name not in _keys:
        need, got, i = CHUNK * LANES, bytearray(), 0
        while len(got) < need:
            got += bytes(b for b in hashlib.sha256(_TAG + i.to_bytes(4, "little")).digest() if b)
            i += 1
        keys = torch.from_numpy(np.frombuffer(bytes(got[:need]), dtype=np.int8).copy()).reshape(CHUNK, LANES)
        _keys[name] = keys.t().contiguous().to(device).t()  # column-major: CUDA's int8 kernel is fast so
    return _keys[name]


def digest(tensor: Any) -> str:
    """Hex digest of `tensor`'s raw bytes (dtype and shape are not part of it: record them next to it)."""
    head, sums = folded(tensor)
    return finish(head, sums.cpu())


def folded(tensor: Any) -> tuple[bytes, Any]:
    """`digest`'s device part, queued without waiting: its header bytes (tag, byte count, each level's size, known
    on the host) and its last level of sums, int32 on the tensor's device, at most HOST_BYTES."""
    data = int_view(tensor).view(torch.int8)
    head = [_TAG + data.numel().to_bytes(8, "little")]
    sums = chunk_sums(data)
    while sums.numel() * 4 > HOST_BYTES:  # fold the sums again on the device: 64x fewer bytes per level
        head.append(sums.numel().to_bytes(8, "little"))
        sums = chunk_sums(sums.reshape(-1).view(torch.int8))
    return b"".join(head), sums


def finish(head: bytes, sums: Any) -> str:
    """`digest` from `folded`'s header and its sums once on the host (int32 CPU tensor)."""
    h = hashlib.sha256(head)
    h.update(sums.numpy().astype("<i4").tobytes())
    return h.hexdigest()


def quick_digest(tensor: Any) -> str:
    """A digest for equality of bytes across the ranks of one run: `sha256:` and sha256 of the raw bytes for a CPU
    tensor and for a device tensor of at most SMALL_BYTES (copied to the host: less than the fold's kernels and
    their wait), else `digest` on the tensor's own device (hashlib's sha256 reads ~1.5 GB/s on one core where the
    fold's int8 products on the CPU read ~0.1); the two kinds never equal each other. convcheck.compare.digest_queue
    gives the same strings without a wait per device tensor."""
    if not tensor.is_cpu:
        if tensor.nbytes > SMALL_BYTES:
            return digest(tensor)
        tensor = tensor.cpu()
    return "sha256:" + tensor_sha256(tensor)


def chunk_sums(data: Any) -> Any:
    """int32 [chunks, LANES] on the data's device: each CHUNK-byte chunk's keyed sums (exact integers); the last
    chunk zero-padded (zero bytes add nothing; the byte count is hashed)."""
    keys = _lanes(data.device)
    full = data.numel() // CHUNK
    parts = [_sums(data[: full * CHUNK].view(full, CHUNK), keys)] if full else []
    if data.numel() > full * CHUNK:
        last = torch.zeros((1, CHUNK), dtype=torch.int8, device=data.device)
        last[0, : data.numel() - full * CHUNK] = data[full * CHUNK :]
        parts.append(_sums(last, keys))
    return torch.cat(parts) if len(parts) > 1 else parts[0] if parts else torch.zeros((0, LANES), dtype=torch.int32)


def _sums(rows: Any, keys: Any) -> Any:
    """rows @ keys as int32: the int8 kernel, or float64 products a step of rows at a time where it cannot run
    (the same integers)."""
    try:
        return torch._int_mm(rows, keys)
    except (RuntimeError, AttributeError):  # e.g. CUDA's kernel wants more than 16 rows: the same integers in float64
        pass
    step = STEP_ROWS.get(rows.device.type, STEP_ROWS["cuda"])
    out = torch.empty((rows.shape[0], LANES), dtype=torch.int32, device=rows.device)
    wide = keys.to(torch.float64)
    for a in range(0, rows.shape[0], step):
        out[a : a + step] = (rows[a : a + step].to(torch.float64) @ wide).to(torch.int32)
    return out
