"""The bridge-upgrade gate: per-case manifests recorded inside verify, compared across library versions.

`case` names a (fixture, layout) case and the default matrix, `manifest` is a case's manifest format (recorded inside
its verify launch by convcheck.engine.recorder), `check` compares two manifests (pure, no torch), `allow` reads the
reviewed expected differences, `release_table` the bridge releases convcheck runs on (releases.toml); the matrix runs
for `convcheck gate record` / `gate check` in convcheck.workflows.gate_runner; `golden/` holds the manifests recorded
on the current pins.
"""

from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
"""Golden manifests shipped with convcheck for its own fixtures (what `convcheck gate check` uses by default)."""

__all__ = ["GOLDEN_DIR"]
