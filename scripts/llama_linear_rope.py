"""Write tiny:llama with linear RoPE scaling (`rope_type: linear`, factor 4) into a folder: the checkpoint that shows
megatron-bridge <= 0.5.1 dropping linear RoPE scaling (fixed by Megatron-Bridge #5097 in 0.6.0)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from convcheck.fixtures.build import build_fixture


def main(out: str) -> int:
    """Build the folder `out` (replaced if present); print its path."""
    target = Path(out)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(build_fixture("tiny:llama"), target, ignore=shutil.ignore_patterns(".complete"))
    config_file = target / "config.json"
    config = json.loads(config_file.read_text())
    config["rope_parameters"] = {**config["rope_parameters"], "rope_type": "linear", "factor": 4.0}
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    print(target)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python scripts/llama_linear_rope.py OUT_FOLDER", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
