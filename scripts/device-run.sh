#!/usr/bin/env bash
# Run convcheck on a GPU machine that has python3 + torch but no internet: install the carried wheels
# (.whl/, see README "GPU runs") into /tmp/site and run `convcheck verify --device cuda` for every fixture,
# then the device compare benchmark. Writes JSON reports and logs to ${OUT:-/tmp/out}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD CONVCHECK_CACHE_DIR=/tmp/convcheck-cache NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'
for model in ${MODELS:-qwen2 qwen2-tied qwen3 qwen3-moe llama}; do
  python3 -m convcheck verify --device cuda --model "tiny:$model" --table none ${ORACLES:+--oracle $ORACLES} \
    --json "$OUT/verify-$model.json" --log-dir "/tmp/logs-$model" ${EXTRA:-}
  echo "verify tiny:$model exit $?"
done
python3 bench/bench_compare.py --device cuda --gib ${BENCH_GIB:-4} | tee "$OUT/bench-compare.json"
