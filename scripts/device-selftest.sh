#!/usr/bin/env bash
# The full selftest on a GPU machine, once per device in DEVICES (default "cuda auto"), JOBS launches at a time:
# kill matrices and logs go to ${OUT:-/tmp/out}/selftest-<device>.{json,log}. SELFTEST_ARGS adds options
# (e.g. "--quick" or "--model tiny:llama"). Compare a matrix with a CPU one: scripts/compare-kill-matrices.py.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh  # also OUT (default /tmp/out), made
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
echo "torch $(python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count(), "GPU(s)")'), $(nproc --all) cores"
status=0
for dev in ${DEVICES:-cuda auto}; do
  python3 -m convcheck selftest --device "$dev" --jobs "${JOBS:-5}" --timeout "${TIMEOUT:-300}" ${SELFTEST_ARGS:-} \
    --json "$OUT/selftest-$dev.json" > "$OUT/selftest-$dev.log" 2>&1
  code=$?
  echo "== selftest --device $dev -> exit $code"
  grep -E "ERRORED|SURVIVED|FALSE ALARM|error:" "$OUT/selftest-$dev.log" | head -40
  tail -1 "$OUT/selftest-$dev.log"
  [ $code -eq 0 ] || status=$code
done
exit $status
