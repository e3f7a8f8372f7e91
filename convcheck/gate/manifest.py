"""The gate manifest of one case: what the bridge exported, how it mapped, which config it wrote, what oracles said.

Version-neutral plain JSON (no library objects), written by rank 0 inside the case's verify launch
(`Job.manifest_out`), read by `convcheck.gate.check`. Readable: one line per tensor, task, field and finding.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from convcheck.atomic import write_text_atomic
from convcheck.errors import BadInput

FORMAT = "convcheck-gate-manifest/1"
COMPARED = ("source", "export", "tasks", "config", "oracles")
"""The sections `convcheck.gate.check` compares; `case` names the case and `run` (versions, device, hooks) is shown."""
_ONE_LINE = 150
"""A JSON value whose compact text fits in this many characters is written on one line."""
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def check_manifest_path(path: str) -> str:
    """The absolute path a manifest may be written to (its folder exists); BadInput otherwise."""
    target = Path(path).expanduser().resolve()
    if target.is_dir():
        raise BadInput(f"manifest path {path} is a folder, not a file")
    if not target.parent.is_dir():
        raise BadInput(f"manifest folder does not exist: {target.parent}")
    return str(target)


def jsonable(value: Any) -> Any:
    """A JSON value for a config field: containers kept, non-finite floats and objects spelled as stable text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if callable(value) and hasattr(value, "__qualname__"):
        return f"<{value.__qualname__}>"
    return _ADDRESS.sub("", repr(value))


def oracle_records(verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Each oracle's verdict, checked count and findings (kind, tensor and the one-line message)."""
    out = {}
    for v in verdicts:
        findings = [{"kind": f["kind"], "tensor": f["tensor"], "message": f["message"]} for f in v.get("findings", [])]
        out[v["name"]] = {"verdict": v["verdict"], "checked": v["checked"], "unit": v["unit"], "findings": findings}
    return out


def build_manifest(
    *,
    case: dict[str, Any],
    run: dict[str, Any],
    source: dict[str, dict[str, Any]],
    exported: dict[str, dict[str, Any]],
    export_error: str | None,
    tasks: dict[str, Any],
    config: dict[str, Any],
    verdicts: list[dict[str, Any]],
) -> dict[str, Any]:
    """The manifest dict from what rank 0 collected (source and export: name -> digest entry, made by
    convcheck.engine.recorder.tensor_entry)."""
    from hashlib import sha256

    fingerprint = sha256(json.dumps(sorted(source.items()), sort_keys=True).encode()).hexdigest()
    tensors = {}
    for name in sorted(exported):
        entry = dict(exported[name])
        if name in source:
            entry["equals_source"] = all(entry[k] == source[name][k] for k in ("dtype", "shape", "sha256"))
        tensors[name] = entry
    return {
        "format": FORMAT,
        "case": case,
        "run": run,
        "source": {"tensors": len(source), "sha256": fingerprint},
        "export": {"error": export_error, "tensors": tensors},
        "tasks": dict(sorted(tasks.items())),
        "config": {k: jsonable(config[k]) for k in sorted(config)},
        "oracles": oracle_records(verdicts),
    }


def dumps(manifest: dict[str, Any]) -> str:
    """Readable JSON: nested objects indented, any value that fits on one line kept on one line."""
    return _render(manifest, 0) + "\n"


def _render(value: Any, depth: int) -> str:
    compact = json.dumps(value, separators=(", ", ": "))
    if not isinstance(value, (dict, list)) or not value or len(compact) + 2 * depth <= _ONE_LINE:
        return compact
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_render(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    return "[\n" + ",\n".join(f"{inner}{_render(v, depth + 1)}" for v in value) + f"\n{pad}]"


def write_manifest(path: str | Path, manifest: dict[str, Any]) -> None:
    """Write a manifest atomically."""
    write_text_atomic(path, dumps(manifest))


def load_manifest(path: str | Path) -> dict[str, Any]:
    """A manifest read back; BadInput names an unreadable file or another format."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(f"no manifest at {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"cannot read manifest {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise BadInput(f"{path} is not a gate manifest of format {FORMAT} (found {found!r})")
    missing = [k for k in ("case", *COMPARED) if k not in data]
    if missing:
        raise BadInput(f"manifest {path} lacks {', '.join(missing)}")
    return data
