#!/usr/bin/env bash
# Run convcheck on a GPU machine that has python3 + torch but no internet: install the carried wheels
# (.whl/, see README "GPU runs") into /tmp/site, run `convcheck verify --device cuda` for each case, then the
# device compare benchmark. Cases: CASES="model|args;model|args" (default: every fixture at TP1, and
# tiny:qwen3-moe at TP2, EP2, TP2xEP2 when 2 GPUs are visible). Reports go to ${OUT:-/tmp/out}.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh  # also OUT (default /tmp/out), made
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "torch $(python3 -c 'import torch; print(torch.__version__)') gpus $gpus"
default="qwen2|;qwen2-tied|;qwen3|;qwen3-moe|;llama|"
[ "$gpus" -ge 2 ] && default="$default;qwen3-moe|--tp 2;qwen3-moe|--ep 2;qwen3-moe|--tp 2 --ep 2;qwen3|--tp 2"
IFS=';' read -ra cases <<< "${CASES:-$default}"
for case in "${cases[@]}"; do
  model=${case%%|*}; args=${case#*|}; tag="$model$(echo "$args" | tr -d ' -')"
  python3 -m convcheck verify --device cuda --model "tiny:$model" $args --table none ${ORACLES:+--oracle $ORACLES} \
    --json "$OUT/verify-$tag.json" --log-dir "/tmp/logs-$tag"
  echo "== verify tiny:$model $args -> exit $?"
done
python3 -c "import glob,json; json.dump({p: json.load(open(p)) for p in sorted(glob.glob(\"$OUT/verify-*.json\"))}, open(\"$OUT/verify-all.json\",\"w\"), indent=1)"; rm -f $OUT/verify-*[!l].json
python3 bench/bench_compare.py --device cuda --gib ${BENCH_GIB:-4} > "$OUT/bench-compare.json"; cat "$OUT/bench-compare.json"
