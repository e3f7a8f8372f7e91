"""The SHIMS table: every shim listed once, in the module of the dependency it makes up for, with upstream file:line
targets that exist and a test that exists; and no shim decides by torch.cuda.is_available()."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from convcheck import compat
from tests.conftest import ROOT
from tests.support.release_targets import on_current_pins, release_label

MODULE_FOR = {
    "transformer_engine": (
        "convcheck.compat.no_te",
        "convcheck.compat.no_te_gdn",
        "convcheck.compat.no_te_olmoe",
        "convcheck.compat.te_standin",
    ),
    "cuda": ("convcheck.compat.no_cuda",),
    "mamba_ssm": ("convcheck.compat.no_mamba_ssm",),
    "fla": ("convcheck.compat.no_fla",),
    "nccl": ("convcheck.compat.no_nccl",),
}
"""Missing dependency -> the compat modules its shims may live in."""


def _site_packages() -> Path:
    spec = importlib.util.find_spec("megatron.core")
    assert spec is not None and spec.origin
    return Path(spec.origin).parents[2]


def table_problems(shims: tuple[compat.Shim, ...], targets: bool = True) -> list[str]:
    """One line per defect of a SHIMS table (empty when it is sound); `targets`: check the upstream file:line too."""
    problems = []
    numbers = [s.number for s in shims]
    if sorted(numbers) != list(range(1, len(shims) + 1)):
        problems.append(f"shim numbers are not 1..{len(shims)} once each: {numbers}")
    site = _site_packages()
    for s in shims:
        allowed = MODULE_FOR.get(s.missing, ())
        if s.module not in allowed:
            problems.append(f"shim {s.number}: missing {s.missing!r} belongs in {' or '.join(allowed)}, not {s.module}")
        spec = importlib.util.find_spec(s.module)
        if spec is None or not spec.origin or f"# --- Shim {s.number} -" not in Path(spec.origin).read_text():
            problems.append(f"shim {s.number}: no '# --- Shim {s.number}' upstream comment in {s.module}")
        if not s.seen_in:
            problems.append(f"shim {s.number}: no seen_in (the releases that need it)")
        for target in s.targets if targets else ():
            file, _, line = target.rpartition(":")
            path = site / file
            if not path.is_file() or not line.isdigit() or int(line) > len(path.read_text().splitlines()):
                problems.append(f"shim {s.number}: upstream target {target} does not exist")
        test_file, _, test_name = s.test.partition("::")
        path = ROOT / test_file
        if not path.is_file() or f"def {test_name}(" not in path.read_text():
            problems.append(f"shim {s.number}: test {s.test} does not exist")
    return problems


def test_shims_table_is_sound() -> None:
    """Off the current pins the file:line targets (the current pins' lines) are not checked; the shim tests are."""
    assert table_problems(compat.SHIMS, targets=on_current_pins()) == []
    assert [s.missing for s in compat.SHIMS].count("cuda") == 14  # shims 2-6, 9, 11, 12, 18, 22, 23 and 27-29


def test_planted_table_defects_are_named() -> None:
    if not on_current_pins():
        pytest.skip(f"{release_label()}: the planted target is a line of the current pins' upstream files")
    bad = list(compat.SHIMS)
    bad[4] = dataclasses.replace(bad[4], test="tests/test_compat_forward.py::test_gone")
    bad[6] = dataclasses.replace(bad[6], module="convcheck.compat.no_cuda")
    bad[9] = dataclasses.replace(bad[9], targets=("megatron/core/ssm/mamba_mixer.py:99999",))
    assert table_problems(tuple(bad)) == [
        "shim 5: test tests/test_compat_forward.py::test_gone does not exist",
        "shim 7: missing 'transformer_engine' belongs in convcheck.compat.no_te or convcheck.compat.no_te_gdn or "
        "convcheck.compat.no_te_olmoe or convcheck.compat.te_standin, not convcheck.compat.no_cuda",
        "shim 7: no '# --- Shim 7' upstream comment in convcheck.compat.no_cuda",
        "shim 10: upstream target megatron/core/ssm/mamba_mixer.py:99999 does not exist",
    ]
    assert table_problems(tuple(bad[:-1]) + (dataclasses.replace(bad[-1], number=3),))[0].startswith("shim numbers")


def test_no_shim_decides_by_cuda_availability() -> None:
    """Issue #18: the run's requested device decides, whatever the host has."""
    for path in sorted((ROOT / "convcheck" / "compat").glob("*.py")):
        assert "is_available(" not in path.read_text(), path.name
