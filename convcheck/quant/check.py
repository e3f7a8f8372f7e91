"""The quant oracle's per-tensor proof (rank side): the bf16 export of a tensor quantized by the reference, against
what the bridge's quantized export sent for it, bitwise; its scales present, valid and on the right grid; the names
quantized as the target says; and the dequantization error within the format's bound."""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from convcheck.compare.bits import compare_bits, same_tensor, tensor_sha256
from convcheck.hf.tensors import TensorReader
from convcheck.quant.names import QuantTarget, loose_reading, module_of
from convcheck.quant.quantizer import Quantizer
from convcheck.verdict import Finding

KEEP_BYTES = 16 << 20
"""An unquantized tensor up to this size is kept for a bitwise compare; a larger one (embeddings, LM head) is compared
with the source tensor (memcmp, where the bf16 export equals it), else by its sha256, shape and dtype."""


SAMPLE_ROWS = 128
"""Rows of a tensor the sampled dequantization bound measures (whole blocks: rounded up to the block's rows)."""


def owner(name: str, world: int) -> int:
    """The rank that checks HF tensor `name` (every rank receives every exported tensor; each checks its share)."""
    return zlib.crc32(name.encode()) % world


@dataclass
class Expected:
    """What one rank expects for one HF tensor of its share."""

    bf16: torch.Tensor | None = None
    """An unquantized tensor (sent as it is): a copy up to KEEP_BYTES, the tensor itself where it is the model's own
    memory."""
    from_source: bool = False
    """An unquantized tensor over KEEP_BYTES that equals the source tensor of its name: compared with it again."""
    digest: tuple[str, tuple[int, ...], torch.dtype] | None = None
    """(sha256, shape, dtype) of an unquantized tensor over KEEP_BYTES that does not equal its source tensor."""
    quantized: tuple[torch.Tensor, ...] = ()
    """(q, *scales) of the reference applied to the whole bf16 tensor."""


@dataclass
class QuantCheck:
    """One rank's share of the proof, fed the bf16 export and then the quantized export."""

    quantizer: Quantizer
    target: QuantTarget
    why_not: Mapping[str, str]
    """HF name -> "" where the target quantizes it, else why not (convcheck.quant.names.expected_quantized)."""
    rank: int
    world: int
    suffix: tuple[str, ...] = ()
    """The scale names the quantized export gives each weight (`weight_scale_inv` for the bridge's)."""
    expected: dict[str, Expected] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    got: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    """Weight name -> {"": weight as sent, suffix: scale} of this rank's share, until the weight is complete."""
    checkpoint: Any = None
    """The source checkpoint (convcheck.hf.checkpoint.Checkpoint)."""
    model_storages: frozenset[int] = frozenset()
    """Data pointers of this rank's parameter storages: an exported tensor in one of them costs nothing to keep."""
    reader: Any = None
    bf16_from: str = ""
    """Where the bf16 tensors came from (the oracle's metrics say it)."""
    bound_every: bool = True
    """Measure the dequantization bound on every quantized tensor (else on the first SAMPLE_ROWS rows of the first
    tensor of each shape and dtype)."""
    bound_kinds: set[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=set)
    bounded: int = 0
    """Tensors whose dequantization error was measured on this rank."""
    done: set[str] = field(default_factory=set)
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("reference", "bound", "compare"), 0.0))
    """CPU seconds of this rank's own work: the references, the dequantization bound, the compares."""
    reuse: Any = None
    """A convcheck.quant.reuse.BlockReuse the bridge's quant_fn fills: the references of the quantized tensors are
    then deferred (`defer`) until the quantized export ran, and assembled from its results where they match."""
    pending: dict[str, torch.Tensor | None] = field(default_factory=dict)
    """Quantized tensors whose reference waits for `settle`: the bf16 tensor (model memory, kept for free), or None
    to read it from the source then."""
    findings: list[Finding] = field(default_factory=list)
    checked: int = 0
    worst: float = 0.0
    """The largest (|dequantize(q) - x| / the format's bound) over this rank's quantized tensors."""
    max_error: float = 0.0

    def _read(self, name: str) -> torch.Tensor:
        """The source tensor `name` (this rank's reader of the checkpoint)."""
        if self.reader is None:
            self.reader = TensorReader(self.checkpoint)
        return self.reader.get(name)

    @property
    def source(self) -> Mapping[str, Any]:
        return self.checkpoint.tensors

    def mine(self, name: str) -> bool:
        return owner(name, self.world) == self.rank

    def offer_source(self, name: str) -> None:
        """One source tensor standing for the bf16 export (an earlier drain proved the two equal on every rank): read
        only where it is quantized or small (a large unquantized one is compared with the source when it is sent)."""
        if not self.mine(name):
            return
        entry = self.source[name]
        if self.reuse is not None and not self.why_not.get(name, "not a source tensor"):
            self.pending[name] = None  # read after the quantized export, whose results may give its reference
            return
        if self.why_not.get(name) and entry.nbytes > KEEP_BYTES:
            self.expected[name] = Expected(from_source=True)
            return
        self.offer_bf16(name, self._read(name))

    def offer_bf16(self, name: str, tensor: torch.Tensor) -> None:
        """One tensor of the bf16 export."""
        if not self.mine(name):
            return
        if self.why_not.get(name, "not a source tensor"):
            if tensor.numel() * tensor.element_size() <= KEEP_BYTES:
                self.expected[name] = Expected(bf16=tensor.detach().clone())
            elif tensor.untyped_storage().data_ptr() in self.model_storages:
                self.expected[name] = Expected(bf16=tensor.detach())  # the model's own memory: kept, not copied
            elif name in self.source and same_tensor(self._read(name), tensor):
                self.expected[name] = Expected(from_source=True)
            else:
                self.expected[name] = Expected(digest=(tensor_sha256(tensor), tuple(tensor.shape), tensor.dtype))
            return
        if name in self.expected or name in self.pending:
            self.findings.append(Finding(tensor=name, kind="duplicate", message="the bf16 export sent it twice"))
        if self.reuse is not None and tensor.untyped_storage().data_ptr() in self.model_storages:
            self.pending[name] = tensor.detach()  # the model's own memory: its reference after the quantized export
            return
        self._expect_quantized(name, tensor)

    def settle(self) -> None:
        """After the quantized export: the references deferred for it (assembled from its quant_fn results where
        every block row matches bitwise, else quantized), each checked at once where what was sent is complete."""
        for name, tensor in list(self.pending.items()):
            del self.pending[name]
            self._expect_quantized(name, self._read(name) if tensor is None else tensor)
            parts = self.got.get(name)
            if parts is not None and "" in parts and len(parts) == 1 + len(self.suffix):
                t0 = time.process_time()
                self._tensor(name, self.got.pop(name))
                self.cpu["compare"] += time.process_time() - t0
                self.expected.pop(name, None)

    def _expect_quantized(self, name: str, tensor: torch.Tensor) -> None:
        """The reference of quantized tensor `name` (and its dequantization bound where measured)."""
        t0 = time.process_time()
        out = self.reuse.reference(tensor) if self.reuse is not None else None
        if out is None:
            out = self.quantizer.quantize(tensor)
        self.expected[name] = Expected(quantized=tuple(out))
        t1 = time.process_time()
        self.cpu["reference"] += t1 - t0
        kind = (tuple(tensor.shape), tensor.dtype)
        if not self.bound_every and kind in self.bound_kinds:
            return
        self.bound_kinds.add(kind)
        self.bounded += 1
        if not self.bound_every:  # the sample: the first SAMPLE_ROWS rows (whole blocks) of the tensor
            b0 = self.quantizer.block[0]
            rows = min(tensor.shape[0], -(-SAMPLE_ROWS // b0) * b0)
            tensor, out = tensor[:rows], (out[0][:rows], out[1][: -(-rows // b0)], *out[2:])
        ratio, max_error = self.quantizer.error(tensor, tuple(out))
        self.cpu["bound"] += time.process_time() - t1
        self.worst, self.max_error = max(self.worst, ratio), max(self.max_error, max_error)
        if ratio > 1.0:
            self.findings.append(
                Finding(
                    tensor=name,
                    kind="dequant-bound",
                    message=(
                        f"dequantize(quantize(x)) is {ratio:.3g}x the {self.quantizer.label} rounding bound away "
                        f"from x (max |error| {max_error:.3g})"
                    ),
                    detail={"ratio": ratio},
                )
            )

    def offer_quantized(self, name: str, tensor: torch.Tensor) -> None:
        """One item of the quantized export."""
        self.seen[name] = self.seen.get(name, 0) + 1
        weight, scale = self._split(name)
        if not self.mine(weight):
            return
        if self.seen[name] > 1:
            return  # one finding per name, at the end (finish)
        parts = self.got.setdefault(weight, {})
        parts[scale] = tensor
        expected = self.expected.get(weight)
        complete = expected is not None and (not expected.quantized or len(parts) == 1 + len(self.suffix))
        if complete and "" in parts:  # check now and let both go
            t0 = time.process_time()
            self._tensor(weight, self.got.pop(weight))
            self.cpu["compare"] += time.process_time() - t0
            self.expected.pop(weight, None)

    def _split(self, name: str) -> tuple[str, str]:
        """(weight name, scale suffix or "") of an exported name."""
        for suffix in self.suffix:
            if name.endswith("." + suffix):
                return name[: -len(suffix)] + "weight", suffix
        return name, ""

    def finish(self) -> list[Finding]:
        """This rank's findings once both exports ran to their end."""
        self.settle()
        for name, count in sorted(self.seen.items()):
            if count > 1 and self.mine(self._split(name)[0]):
                message = f"sent {count} times (the first is checked)"
                self.findings.append(Finding(tensor=name, kind="duplicate", message=message))
        for name in sorted(n for n in self.source if self.mine(n) and n not in self.done):
            self._tensor(name, self.got.pop(name, {}))
        for weight, parts in sorted(self.got.items()):
            for suffix in parts:
                shown = weight if not suffix else weight[: -len("weight")] + suffix
                kind, why = (
                    ("scale-orphan", f"a {suffix} for {weight}, which is not a source tensor")
                    if suffix
                    else ("unexpected", "sent but not a source tensor")
                )
                self.findings.append(Finding(tensor=shown, kind=kind, message=why))
        return self.findings

    def _tensor(self, name: str, parts: dict[str, torch.Tensor]) -> None:
        self.done.add(name)
        expected = self.expected.get(name)
        if "" not in parts:
            self.findings.append(Finding(tensor=name, kind="missing", message="not in the quantized export"))
            return
        self.checked += len(parts)
        if expected is None or not expected.quantized:
            self._unquantized(name, parts, expected)
            return
        ref_q, *ref_scales = expected.quantized
        sent = parts[""]
        if sent.dtype != ref_q.dtype and not any(parts.get(s) is not None for s in self.suffix):
            self.findings.append(self._not_quantized(name, sent))
            return
        finding = compare_bits(name, ref_q, sent)
        if finding is not None:
            self.findings.append(self._located(finding, weight=True))
        for suffix, ref_scale in zip(self.suffix, ref_scales, strict=True):
            scale_name = name[: -len("weight")] + suffix
            got = parts.get(suffix)
            if got is None:
                self.findings.append(
                    Finding(
                        tensor=scale_name,
                        kind="scale-missing",
                        message=(
                            f"{name} was sent as {_dt(sent)} without its {suffix}: the rollout cannot dequantize it"
                        ),
                    )
                )
                continue
            self._valid_scale(scale_name, got)
            finding = compare_bits(scale_name, ref_scale, got)
            if finding is not None:
                located = self._located(
                    finding, weight=False, scale_grid=tuple(ref_scale.shape), reference=ref_scale, sent=got
                )
                self.findings.append(located)
                if located.kind == "scale-shape" and got.numel() == ref_scale.numel() and got.dtype == ref_scale.dtype:
                    # the values too, in the reference's grid: a wrong shape must not hide a wrong value
                    values = compare_bits(scale_name, ref_scale, got.reshape(ref_scale.shape))
                    if values is not None:
                        self.findings.append(self._located(values, weight=False))

    def _unquantized(self, name: str, parts: dict[str, torch.Tensor], expected: Expected | None) -> None:
        """A tensor the target keeps unquantized: sent as the bf16 export, with no scale."""
        why = self.why_not.get(name, "")
        for suffix in (s for s in parts if s):
            self.findings.append(
                Finding(
                    tensor=name[: -len("weight")] + suffix,
                    kind="quantized-ignored",
                    message=(
                        f"{name} was quantized, but the target ({self.target.source}) keeps it unquantized: {why}"
                    ),
                )
            )
        sent = parts[""]
        if expected is not None and expected.from_source:
            finding = compare_bits(name, self._read(name), sent)
            if finding is not None:
                self.findings.append(replace(finding, message=f"{finding.message} (unquantized: {why})"))
        if expected is not None and expected.digest is not None:
            digest, shape, dtype = expected.digest
            if (tensor_sha256(sent), tuple(sent.shape), sent.dtype) != (digest, shape, dtype):
                self.findings.append(
                    Finding(
                        tensor=name,
                        kind="bytes-differ",
                        message=(
                            f"sent as {_dt(sent)} {list(sent.shape)}, not the bf16 export's "
                            f"{str(dtype).removeprefix('torch.')} {list(shape)} bytes (sha256 differs; {why})"
                        ),
                    )
                )
        if expected is not None and expected.bf16 is not None:
            finding = compare_bits(name, expected.bf16, sent)
            if finding is not None:
                kind = "quantized-ignored" if sent.dtype != expected.bf16.dtype else finding.kind
                self.findings.append(
                    Finding(
                        tensor=name, kind=kind, message=f"{finding.message} (unquantized: {why})", detail=finding.detail
                    )
                )

    def _not_quantized(self, name: str, sent: torch.Tensor) -> Finding:
        """The finding for a weight the target quantizes that was sent unquantized, naming a pattern that would take
        it only under a loose reading."""
        module = module_of(name)
        loose = [(p, r) for p in self.target.patterns if (r := loose_reading(p, module))]
        hint = (
            (
                f"; the pattern {loose[0][0]!r} takes {module} only as a {loose[0][1]} (it names another module): "
                "it matches too much"
            )
            if loose
            else ""
        )
        return Finding(
            tensor=name,
            kind="not-quantized",
            message=(
                f"sent as {_dt(sent)} {list(sent.shape)} with no scale; the target ({self.target.source}) quantizes "
                f"it: no pattern names its module{hint}"
            ),
            detail={"over_matching": loose[0][0]} if loose else {},
        )

    def _valid_scale(self, name: str, scale: torch.Tensor) -> None:
        values = scale.to(torch.float32) if scale.dtype != torch.uint8 else scale
        bad = ~torch.isfinite(values) | (values <= 0) if scale.dtype != torch.uint8 else values == 255
        if bool(bad.any()):
            index = [int(i) for i in torch.nonzero(bad)[0]] if scale.dim() else []
            self.findings.append(
                Finding(
                    tensor=name,
                    kind="scale-invalid",
                    message=(
                        f"{int(bad.sum())} of {scale.numel()} scales are NaN, infinite or not positive; first at block "
                        f"{index}: {values.reshape(-1)[int(bad.reshape(-1).nonzero()[0])].item()!r}"
                    ),
                )
            )

    def _located(
        self,
        finding: Finding,
        weight: bool,
        scale_grid: tuple[int, ...] = (),
        reference: torch.Tensor | None = None,
        sent: torch.Tensor | None = None,
    ) -> Finding:
        """`finding` with the block of its first differing element named (a scale's index is its block); a scale of
        the wrong shape says whether it holds the reference's values all the same."""
        if finding.kind == "shape" and not weight:
            b0, b1 = self.quantizer.block
            note = f"; the grid of {b0}x{b1} blocks is {list(scale_grid)}"
            if reference is not None and sent is not None and reference.numel() == sent.numel():
                same = compare_bits(finding.tensor, reference.reshape(-1), sent.reshape(-1)) is None
                note += (
                    ": the reference's values in another shape (a rollout reads them on the wrong grid)"
                    if same
                    else ", and the values differ too"
                )
            return Finding(
                tensor=finding.tensor, kind="scale-shape", message=finding.message + note, detail=finding.detail
            )
        if finding.kind != "bytes-differ":
            return finding
        index = finding.detail["first_index"]
        if weight:
            b0, b1 = self.quantizer.block
            col = index[1] * (2 if self.quantizer.element == torch.uint8 else 1) if len(index) > 1 else 0
            block = [index[0] // b0, col // b1] if len(index) > 1 else [index[0] // b0]
        else:
            block = list(index)
        message = finding.message.replace("first at index", f"first in block {block} at index", 1)
        kind = "bytes-differ" if weight else "scale-differs"
        return Finding(tensor=finding.tensor, kind=kind, message=message, detail={**finding.detail, "block": block})


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")
