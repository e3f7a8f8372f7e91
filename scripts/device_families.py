"""On a GPU host (device tool): `convcheck verify --device cuda` and `--device cpu` at TP1 for each tiny family, every
default oracle, and one JSON that says whether both devices reach the same verdicts and findings.

Usage (after `source scripts/device-env.sh`): python3 scripts/device_families.py gemma4 glm5 > "$OUT/families.json"
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def run_verify(model: str, device: str, folder: Path) -> dict[str, Any]:
    """One verify run's report as a dict (or the failure of the run itself, with its exit status and tail)."""
    out = folder / f"{model.replace(':', '-')}-{device}.json"
    cmd = [sys.executable, "-m", "convcheck", "verify", "--model", model, "--device", device, "--table", "none"]
    proc = subprocess.run([*cmd, "--json", str(out)], check=False, capture_output=True, text=True)
    if not out.exists():
        return {"exit": proc.returncode, "tail": (proc.stdout + proc.stderr)[-2000:]}
    report = json.loads(out.read_text())
    report["exit"] = proc.returncode
    return report


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Verdict per oracle and the logits oracle's measured error."""
    if "oracles" not in report:
        return report
    oracles = {o["name"]: o["verdict"] for o in report["oracles"]}
    logits = next((o.get("metrics", {}) for o in report["oracles"] if o["name"] == "logits"), {})
    kept = {k: logits[k] for k in ("max_abs_err", "greedy_match") if k in logits}
    return {"verdict": report["verdict"], "exit": report["exit"], "oracles": oracles, "logits": kept}


def findings(report: dict[str, Any]) -> dict[str, list[list[str]]]:
    """(tensor, kind) of every finding, per oracle: what the two devices must agree on."""
    return {
        o["name"]: [[f["tensor"], f["kind"]] for f in o["findings"]] for o in report.get("oracles", []) if o["findings"]
    }


def main(models: list[str]) -> None:
    import torch

    cases: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            model = name if name.startswith("tiny:") else f"tiny:{name}"
            reports = {device: run_verify(model, device, Path(tmp)) for device in ("cuda", "cpu")}
            same = findings(reports["cuda"]) == findings(reports["cpu"]) and all(
                "oracles" in r for r in reports.values()
            )
            same = same and summary(reports["cuda"])["oracles"] == summary(reports["cpu"])["oracles"]
            cases[model] = {
                **{device: summary(r) for device, r in reports.items()},
                "same_verdicts_and_findings": same,
                "findings": findings(reports["cpu"]),
            }
            print(
                f"== {model}: cuda {reports['cuda'].get('verdict')} cpu {reports['cpu'].get('verdict')} same {same}",
                file=sys.stderr,
                flush=True,
            )
    print(
        json.dumps(
            {
                "what": "convcheck verify --device cuda and --device cpu at TP1 on one GPU host, every default oracle, "
                "verify's default TE layout on the TE stand-in (no TE on the image)",
                "device": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "cases": cases,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
