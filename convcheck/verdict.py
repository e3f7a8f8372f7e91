"""Typed verdicts: what every oracle returns and every renderer reads (plain data, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS = "pass"
FAIL = "fail"
NOT_COVERED = "not-covered"
"""An oracle that found nothing wrong but could not check this model family: convcheck lacks its explicit mappings,
config table or CPU forward (`OracleVerdict.not_covered` says which). Never a pass, never a bridge bug."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One thing an oracle found wrong, named by tensor."""

    tensor: str
    """HF or Megatron tensor name the finding is about."""
    kind: str
    """Short machine-readable category, e.g. "unmapped", "bytes-differ", "duplicate"."""
    message: str
    """One human line: what is wrong and where (first differing element with both values)."""
    detail: dict[str, Any] = field(default_factory=dict)
    """Structured extras: rank, index, expected/actual bits, counts."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tensor": self.tensor, "kind": self.kind, "message": self.message}
        if self.detail:
            out["detail"] = self.detail
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        return cls(tensor=data["tensor"], kind=data["kind"], message=data["message"], detail=data.get("detail", {}))


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorRow:
    """One line of the per-tensor table."""

    tensor: str
    shape: tuple[int, ...]
    dtype: str
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "shape": list(self.shape), "dtype": self.dtype, "verdict": self.verdict}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TensorRow":
        return cls(tensor=data["tensor"], shape=tuple(data["shape"]), dtype=data["dtype"], verdict=data["verdict"])


@dataclass(frozen=True, kw_only=True, slots=True)
class OracleVerdict:
    """The answer of one oracle: pass only when it checked something and found nothing."""

    name: str
    checked: int
    """How many tensors (or elements, as `unit` says) the oracle checked."""
    unit: str = "tensors"
    findings: tuple[Finding, ...] = ()
    rows: tuple[TensorRow, ...] = ()
    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    """Measured numbers (e.g. max abs logits error and its threshold); JSON-serialisable values."""
    not_covered: str = ""
    """What convcheck lacks to check this model (e.g. "no config table for model_type 'deepseek_v3'")."""

    @property
    def verdict(self) -> str:
        if self.findings:
            return FAIL
        if self.not_covered:
            return NOT_COVERED
        return PASS if self.checked > 0 else FAIL

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "checked": self.checked,
            "unit": self.unit,
            "seconds": round(self.seconds, 3),
            "findings": [f.to_dict() for f in self.findings],
            "tensors": [r.to_dict() for r in self.rows],
            **({"metrics": dict(self.metrics)} if self.metrics else {}),
            **({"not_covered": self.not_covered} if self.not_covered else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OracleVerdict":
        return cls(
            name=data["name"],
            checked=int(data["checked"]),
            unit=data.get("unit", "tensors"),
            findings=tuple(Finding.from_dict(f) for f in data.get("findings", [])),
            rows=tuple(TensorRow.from_dict(r) for r in data.get("tensors", [])),
            seconds=float(data.get("seconds", 0.0)),
            metrics=dict(data.get("metrics", {})),
            not_covered=data.get("not_covered", ""),
        )


def make_verdict(name: str, checked: int, findings: list[Finding], unit: str = "tensors", **kw: Any) -> OracleVerdict:
    """Build a verdict with findings sorted by tensor name then kind (stable, readable reports)."""
    ordered = tuple(sorted(findings, key=lambda f: (f.tensor, f.kind, f.message)))
    return OracleVerdict(name=name, checked=checked, unit=unit, findings=ordered, **kw)


@dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    """Everything one `convcheck verify` run concluded."""

    model: str
    layout: dict[str, int]
    device: str
    versions: dict[str, str]
    oracles: tuple[OracleVerdict, ...]
    seconds: float = 0.0
    causes: tuple[str, ...] = ()
    """One line per cause that explains many findings at once (shown before them)."""
    device_reason: str = ""
    """Why the run used `device` (requested, or what --device auto decided)."""
    rank0_peak_MB: dict[str, float] = field(default_factory=dict)
    """Rank 0's RSS high-water mark per phase (bring_up, then each oracle), in MB; not part of to_dict."""
    rank0_anon_peak_MB: dict[str, float] = field(default_factory=dict)
    """The same for its anonymous memory alone (RssAnon, sampled every 20 ms: mapped file pages left out)."""

    @property
    def verdict(self) -> str:
        """fail if any oracle fails; else not-covered if any could not check this family; else pass."""
        verdicts = {o.verdict for o in self.oracles}
        if not self.oracles or FAIL in verdicts:
            return FAIL
        return NOT_COVERED if NOT_COVERED in verdicts else PASS

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "model": self.model,
            "layout": self.layout,
            "device": self.device,
            "versions": self.versions,
            "seconds": round(self.seconds, 3),
            **({"device_reason": self.device_reason} if self.device_reason else {}),
            **({"causes": list(self.causes)} if self.causes else {}),
            "oracles": [o.to_dict() for o in self.oracles],
        }


def missing_verdict(name: str) -> OracleVerdict:
    """The failing verdict of an oracle that was asked for but produced none."""
    finding = Finding(
        tensor="<oracle>", kind="no-verdict", message=f"oracle {name} was requested but returned no verdict"
    )
    return OracleVerdict(name=name, checked=0, findings=(finding,))


def complete(requested: tuple[str, ...], verdicts: tuple[OracleVerdict, ...]) -> tuple[OracleVerdict, ...]:
    """Every requested oracle in request order; one that produced no verdict fails, naming itself."""
    by_name = {v.name: v for v in verdicts}
    extra = tuple(v for v in verdicts if v.name not in requested)
    return tuple(by_name.get(name) or missing_verdict(name) for name in requested) + extra
