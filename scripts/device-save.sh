#!/usr/bin/env bash
# The save oracle on one GPU: verify --oracle save on fixtures at TP1 (CUDA), then the realsize bench of the save
# oracle against the bare roundtrip. Wheels as docs/gpu.md says, plus nvidia-modelopt, requests, scipy (the bridge's
# writer imports modelopt) and PuLP as a plain folder .whl/pysite/pulp (its solver binaries left out). Reports: $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh  # also OUT (default /tmp/out), made
export PYTHONPATH=$PYTHONPATH:$PWD/.whl/pysite
python3 -c 'from modelopt.torch.quantization.utils import is_quantized' || exit 7
IFS=';' read -ra cases <<< "${CASES:-qwen2-tied|;qwen3-moe|;llama|;deepseek-v3|;moonlight|--save-dtype bf16;nemotron-h|}"
for case in "${cases[@]}"; do
  model=${case%%|*}; args=${case#*|}; tag="$model$(echo "$args" | tr -d ' -')"
  python3 -m convcheck verify --device cuda --model "tiny:$model" $args --oracle save --table none \
    --json "$OUT/save-$tag.json"
  echo "== save tiny:$model $args -> exit $?"
done
python3 bench/bench_realsize.py --layers ${LAYERS:-1} --device cuda --runs "coverage,roundtrip;save" --work /tmp/realsize \
  > "$OUT/realsize-save.json"; echo "== realsize -> exit $?"; tail -c 3000 "$OUT/realsize-save.json"
