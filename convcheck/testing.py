"""Assertion helpers for other repos' tests: bitwise tensors, whole checkpoints, verify reports (no pytest needed).

Each raises AssertionError with a precise message: the tensor, the first differing index, both values and their bits.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from convcheck.compare.bits import compare_bits
from convcheck.hf.checkpoint import open_checkpoint
from convcheck.hf.tensors import TensorReader
from convcheck.layout import ParallelLayout
from convcheck.verdict import FAIL, NOT_COVERED, OracleVerdict, Report

__all__ = ["assert_bitwise_equal", "assert_same_checkpoint", "assert_verdict_pass"]


def assert_bitwise_equal(actual: Any, expected: Any, name: str = "tensor") -> None:
    """Fail unless `actual` has the dtype, shape and raw bytes of `expected` (integer views: -0.0 != 0.0)."""
    __tracebackhide__ = True

    for label, value in (("actual", actual), ("expected", expected)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"assert_bitwise_equal: {label} must be a torch.Tensor, got {type(value).__name__}")
    if actual.device != expected.device:
        actual, expected = actual.cpu(), expected.cpu()
    finding = compare_bits(name, expected, actual)
    if finding is not None:
        raise AssertionError(f"{name}: {finding.message}")


def assert_same_checkpoint(dir_a: str | os.PathLike[str], dir_b: str | os.PathLike[str]) -> None:
    """Fail unless two HF checkpoint folders hold the same tensor names, dtypes, shapes and bytes (`dir_a` is the
    reference); tensors are read one at a time."""
    __tracebackhide__ = True
    problems = checkpoint_differences(dir_a, dir_b)
    if problems:
        head = f"checkpoints differ in {len(problems)} place(s): {dir_b} (b) vs {dir_a} (a, expected)"
        raise AssertionError("\n".join([head, *(f"  {p}" for p in problems)]))


def checkpoint_differences(dir_a: str | os.PathLike[str], dir_b: str | os.PathLike[str]) -> list[str]:
    """One line per difference between two checkpoint folders: names missing on either side, then per tensor."""
    a, b = open_checkpoint(dir_a), open_checkpoint(dir_b)
    names_a, names_b = set(a.tensors), set(b.tensors)
    problems = [f"{n}: only in a" for n in sorted(names_a - names_b)]
    problems += [f"{n}: only in b" for n in sorted(names_b - names_a)]
    reader_a, reader_b = TensorReader(a), TensorReader(b)
    for name in sorted(names_a & names_b):
        entry_a, entry_b = a.tensors[name], b.tensors[name]
        if entry_a.dtype != entry_b.dtype:
            problems.append(f"{name}: dtype {entry_b.torch_dtype}, expected {entry_a.torch_dtype}")
        elif entry_a.shape != entry_b.shape:
            problems.append(f"{name}: shape {list(entry_b.shape)}, expected {list(entry_a.shape)}")
        else:
            finding = compare_bits(name, reader_a.get(name), reader_b.get(name))
            if finding is not None:
                problems.append(f"{name}: {finding.message}")
    return problems


def assert_verdict_pass(report: Report | dict[str, Any]) -> None:
    """Fail unless every oracle of a verify Report (or its JSON dict) passed; the message lists every failing oracle
    with all its findings."""
    __tracebackhide__ = True
    if isinstance(report, dict):
        report = _report_from_dict(report)
    if not isinstance(report, Report):
        raise TypeError(f"assert_verdict_pass: expected a convcheck Report, got {type(report).__name__}")
    failed = [o for o in report.oracles if o.verdict == FAIL]
    uncovered = [o for o in report.oracles if o.verdict == NOT_COVERED]
    if report.oracles and not failed and not uncovered:
        return
    where = f"{report.model} at {ParallelLayout.from_dict(report.layout).label}"
    if not report.oracles:
        raise AssertionError(f"convcheck verify {where}: no oracle ran, so nothing was proven")
    if failed:
        lines = [f"convcheck verify {where}: FAIL ({len(failed)} of {len(report.oracles)} oracles failed)"]
    else:
        lines = [f"convcheck verify {where}: NOT COVERED ({len(uncovered)} of {len(report.oracles)} oracles cannot "
                 "check this model family; nothing failed)"]  # fmt: skip
    for oracle in failed:
        lines.extend(_oracle_lines(oracle))
    lines += [f"  {o.name}: not covered: {o.not_covered}" for o in uncovered]
    raise AssertionError("\n".join(lines))


def _oracle_lines(oracle: OracleVerdict) -> list[str]:
    """The failing oracle's summary line and one line per finding."""
    if not oracle.findings:
        return [f"  {oracle.name}: checked {oracle.checked} {oracle.unit} and found nothing (an oracle must check)"]
    out = [f"  {oracle.name}: {len(oracle.findings)} finding(s), checked {oracle.checked} {oracle.unit}"]
    out += [f"    {f.tensor} [{f.kind}] {f.message}" for f in oracle.findings]
    return out


def _report_from_dict(data: dict[str, Any]) -> Report:
    """A Report from the dict `Report.to_dict()` / `convcheck verify --json` writes."""
    return Report(
        model=str(data.get("model", "?")),
        layout=dict(data.get("layout") or {}),
        device=str(data.get("device", "?")),
        versions=dict(data.get("versions") or {}),
        oracles=tuple(OracleVerdict.from_dict(o) for o in data.get("oracles", [])),
        seconds=float(data.get("seconds", 0.0)),
    )
