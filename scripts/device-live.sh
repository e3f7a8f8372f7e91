#!/usr/bin/env bash
# On a GPU host (device tool): convcheck inside a user's job on NCCL. (1) tests/live_trainer.py (a stand-in trainer:
# its own NCCL groups, DDP-wrapped chunks on the GPUs) calls convcheck.live.check clean and with a planted mapping bug;
# (2) `torchrun ... -m convcheck verify --device cuda` (convcheck as torchrun's entry), clean and planted. One rank per
# GPU (TP = the GPUs seen, at most 2). Needs the wheels in .whl/ (docs/gpu.md). Results in ${OUT:-/tmp/out}.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh  # also OUT (default /tmp/out), made
export OMP_NUM_THREADS=1
read -r TORCH GPUS < <(python3 -c 'import torch; print(torch.__version__, min(torch.cuda.device_count(), 2))')
echo "torch $TORCH, $GPUS GPU(s) used, $(nproc --all) cores"
CKPT=$(python3 -c 'from convcheck.api import resolve_model; print(resolve_model("tiny:qwen3"))')
mkdir -p "$OUT/live"
start=$(date +%s)
LIVE_DEVICE=cuda python3 -m torch.distributed.run --standalone --nproc-per-node "$GPUS" tests/live_trainer.py \
  "$CKPT" "$GPUS" 1 1 coverage,differential,mapping,receiver,idempotence "$OUT/live" bucketed > "$OUT/live.log" 2>&1
echo "== live trainer TP$GPUS on cuda: exit $? in $(( $(date +%s) - start )) s"
rm -rf "$OUT/live/export"
base=(python3 -m torch.distributed.run --standalone --nproc-per-node "$GPUS" -m convcheck verify --device cuda
      --model tiny:qwen3-moe --tp "$GPUS" --oracle coverage,roundtrip,mapping)
for tag in clean planted; do
  extra=(); [ "$tag" = planted ] && extra=(--hook convcheck.mutants.bridge:swap_qk_head0)
  start=$(date +%s)
  "${base[@]}" "${extra[@]}" --json "$OUT/entry-$tag.json" > "$OUT/entry-$tag.txt" 2>&1
  echo "== torchrun entry $tag: exit $? in $(( $(date +%s) - start )) s: $(grep -E '^(PASS|FAIL)' "$OUT/entry-$tag.txt" | tail -1)"
done
# The cross-rank digests on the GPU (compare.digest_queue's pinned staging, compare.fold): their GPU tests run here.
start=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests/test_digest_queue.py tests/test_fold.py > "$OUT/digest-tests.txt" 2>&1
echo "== digest GPU tests: exit $? in $(( $(date +%s) - start )) s: $(tail -1 "$OUT/digest-tests.txt")"
