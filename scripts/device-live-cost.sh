#!/usr/bin/env bash
# On a GPU host (device tool): the live check's cost (issue #32) in one call. In one process each
# (bench/bench_live_ab.py), this checkout's live.check against BASE's: one H200 (TP1, NCCL) and two gloo ranks on the
# host's cores (EP2), the Qwen3-30B-A3B cut at 8 layers x 128 experts, tiny dims; two GPUs (EP2, NCCL) where the host
# has them; then bench/bench_live.py on the full 48-layer cut at real dims with names only (random init, ~61 GB on the
# GPU). BASE is a folder holding another convcheck/ (the device's copy has no git history): make it here first, e.g.
#   mkdir -p base && git archive 76efac6 convcheck | tar -x -C base   # carried as untracked files
# Needs the wheels in .whl/ (docs/gpu.md). Results in ${OUT:-/tmp/out}/live-cost-*.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh  # also OUT (default /tmp/out), made
source scripts/modelopt-standin.sh  # the image lacks nvidia-modelopt: without it every export retries an import
export OMP_NUM_THREADS=1
BASE=${BASE:-base}
ROUNDS=${ROUNDS:-12}
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
run() {  # name, command...
  local name=$1 start=$SECONDS
  shift
  "$@" > "$OUT/live-cost-$name.json" 2> "$OUT/live-cost-$name.err"
  echo "== $name: exit $? in $(( SECONDS - start )) s: $(head -c 600 "$OUT/live-cost-$name.json")"
}
AB=(python3 bench/bench_live_ab.py --base "$BASE" --realsize-layers 8 --tiny-dims --rounds "$ROUNDS")
run ab-tp1-cuda "${AB[@]}" --device cuda
run ab-ep2-cores "${AB[@]}" --ep 2
[ "$GPUS" -ge 2 ] && run ab-ep2-cuda "${AB[@]}" --ep 2 --device cuda
run 48l-names-cuda python3 bench/bench_live.py --realsize-layers 48 --names-only --device cuda --repeat 3
