#!/usr/bin/env bash
# `convcheck support` for gated Megatron-Bridge releases on a machine without internet (a GPU host's CPU cores), several
# releases at once. Each release installs its carried wheels into its own --target folder: .whl/common (what every
# release imports), .whl/pulp (PuLP, which modelopt imports; its wheel repacked with the x86-64 Linux CBC binary only,
# to fit the 64 MiB a device call carries), .whl/extra (pydantic, used only when the host lacks it) and the release's
# folders in one pip call (a later folder's wheel of a project replaces an earlier folder's: RUNS="0.4.1:r040+r041:6"
# installs 0.4.0's stack with bridge 0.4.1 in its place).
# docs/support-releases.md lists the wheels of each folder (`pip download --no-deps` of `python -m
# convcheck.gate.release_table requirements X`).
#
#   RUNS="0.6.0:r060:8 0.3.0:r030:6" LIMIT=560 OUT=/tmp/out bash scripts/device-support.sh
#
# Writes $OUT/support-bridge-X.json (rewritten after every architecture, so a run cut at LIMIT seconds keeps its rows),
# its log and, for a run that finishes, its Markdown table; a table found at resume/support-bridge-X.json is resumed
# (its rows are kept, not run again).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-560}
mkdir -p "$OUT"
extra=()
python3 -c "import pydantic" 2>/dev/null || extra=(.whl/extra/*.whl)
pids=()
for run in ${RUNS:?say RUNS=\"RELEASE:FOLDER[+FOLDER]:JOBS ...\"}; do
  IFS=: read -r rel folders jobs <<<"$run"
  site=/tmp/support-site-$rel
  rm -rf "$site"
  pip=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site")
  # one pip call for the release's whole stack: a later folder's wheel of a project replaces an earlier folder's (a
  # second `--upgrade --target` call would replace the whole megatron/ tree of a namespace package and keep the older
  # dist-info beside the newer, so megatron.core could vanish and metadata name the older release)
  wheels=$(for folder in ${folders//+/ }; do ls ".whl/$folder"/*.whl; done | python3 -c '
import sys, os
chosen = {}
for path in sys.stdin.read().split():
    chosen[os.path.basename(path).split("-")[0].lower()] = path
print("\n".join(chosen.values()))')
  "${pip[@]}" .whl/common/*.whl .whl/pulp/*.whl "${extra[@]}" $wheels || exit 3
  resume=()
  [ -f "resume/support-bridge-$rel.json" ] && resume=(--resume "resume/support-bridge-$rel.json")
  (
    export PYTHONPATH="$site:$PWD" CONVCHECK_CACHE_DIR="/tmp/convcheck-cache-$rel" CONVCHECK_DEVICE=cpu PYTHONUNBUFFERED=1
    python3 -c 'from importlib import metadata as m; print(*(f"{p} {m.version(p)}" for p in ("megatron-bridge", "megatron-core", "transformers", "torch")), sep=", ")'
    timeout -s INT -k 30 "$LIMIT" python3 -m convcheck support --jobs "$jobs" --timeout 400 \
      --json "$OUT/support-bridge-$rel.json" --markdown "$OUT/support-bridge-$rel.md" "${resume[@]}"
    echo "exit $?"
  ) >"$OUT/support-bridge-$rel.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
tail -n 4 "$OUT"/support-bridge-*.log
