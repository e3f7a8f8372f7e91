"""The job one `convcheck verify` hands to its ranks, and the result files they hand back."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from convcheck.layout import ParallelLayout


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """Everything a rank needs to run the oracles for one (model, layout)."""

    model_path: str
    """Folder of the HF checkpoint."""
    model_label: str
    """What the user asked for (a path or tiny:<name>)."""
    layout: ParallelLayout
    device: str = "cpu"
    oracles: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    """`module:function` or `file.py:function` callables run in every rank before the model is built."""
    workdir: str = "."
    """Folder for the job file, per-rank error files and the result."""
    timeout_s: float = 600.0
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def result_file(self) -> Path:
        return Path(self.workdir) / "result.json"

    def error_file(self, rank: int) -> Path:
        return Path(self.workdir) / f"rank{rank}.error.json"

    def save(self) -> Path:
        path = Path(self.workdir) / "job.json"
        data = asdict(self)
        data["layout"] = self.layout.to_dict()
        path.write_text(json.dumps(data, indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Job":
        data = json.loads(Path(path).read_text())
        data["layout"] = ParallelLayout.from_dict(data["layout"])
        data["oracles"] = tuple(data["oracles"])
        data["hooks"] = tuple(data["hooks"])
        return cls(**data)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # unique: concurrent writers never share it
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
