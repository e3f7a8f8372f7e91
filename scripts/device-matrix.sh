#!/usr/bin/env bash
# On a GPU host (device tool): the CPU verify matrix of the test suite with --device cpu, the same with --device auto
# (MODES="" skips both), then every oracle over NCCL at TP2, EP2, TP2xEP2, PP2 (and NemotronH TP2) when 2 GPUs are
# visible. Needs the wheels in .whl/ (README "GPU runs"). Results: ${OUT:-/tmp/out}/matrix-*.txt, nccl.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh  # also OUT (default /tmp/out), made
export OMP_NUM_THREADS=1
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "torch $(python3 -c 'import torch; print(torch.__version__)') gpus $gpus cores $(nproc --all)"
for name in qwen2 qwen2-tied qwen3 qwen3-moe llama nemotron-h; do python3 -m convcheck fixtures build "tiny:$name" >/dev/null; done
workers=${WORKERS:-8}
for mode in ${MODES-cpu auto}; do
  start=$(date +%s)
  CONVCHECK_DEVICE=$mode python3 -m pytest -q -p no:cacheprovider -n "$workers" tests/test_verify_matrix.py \
    > "$OUT/matrix-$mode.txt" 2>&1
  echo "== matrix --device $mode: exit $? in $(( $(date +%s) - start )) s: $(tail -1 "$OUT/matrix-$mode.txt")"
done
if [ "$gpus" -ge 2 ]; then
  for case in "qwen3-moe|--tp 2" "qwen3-moe|--ep 2" "qwen3-moe|--tp 2 --ep 2" "qwen3|--pp 2" "nemotron-h|--tp 2"; do
    model=${case%%|*}; args=${case#*|}; tag="$model$(echo "$args" | tr -d ' -')"
    python3 -m convcheck verify --device cuda --model "tiny:$model" $args --json "$OUT/nccl-$tag.json" > "$OUT/nccl-$tag.txt" 2>&1
    echo "== nccl tiny:$model $args -> exit $?: $(tail -1 "$OUT/nccl-$tag.txt")"
  done
  python3 -c "import glob,json; json.dump({p: json.load(open(p)) for p in sorted(glob.glob('$OUT/nccl-*.json'))}, open('$OUT/nccl.json','w'), indent=1)"
  rm -f "$OUT"/nccl-*.json
  tail -n 3 "$OUT"/nccl-*.txt > "$OUT/nccl-tails.txt"; rm -f "$OUT"/nccl-*.txt
fi
