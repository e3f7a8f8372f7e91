#!/usr/bin/env bash
# On a 2-GPU host (device tool): the NCCL runs of the sync, checkpoint and reshard oracles, each clean case and
# its planted bug, then the broadcast and reshard benches. Needs the wheels in .whl/ (README "GPU runs").
# Results in ${OUT:-/tmp/out}: verify.json (every report), tails.txt (last lines of each run), bench-*.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh  # also OUT (default /tmp/out), made
export OMP_NUM_THREADS=1
echo "torch $(python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count())') cores $(nproc --all)"
M=convcheck.mutants
default_cases="
ckpt-ep2-to-tp2|tiny:qwen3-moe|--ep 2 --oracle distckpt --resume-layout tp2 --resume-layout tp1
ckpt-tp2-to-ep2|tiny:qwen3-moe|--tp 2 --oracle distckpt --resume-layout ep2 --resume-layout tp1
ckpt-ep2-moment-misplaced|tiny:qwen3-moe|--ep 2 --oracle distckpt --resume-layout tp2 --hook $M.checkpoint:moment_on_wrong_expert
ckpt-tp2-key-dropped|tiny:qwen3-moe|--tp 2 --oracle distckpt --resume-layout tp1 --hook $M.checkpoint:drop_key_on_restore
reshard-tp2|tiny:qwen3|--tp 2 --oracle reshard --target-tp 1 --target-tp 2 --target-tp 4
reshard-ep2|tiny:qwen3-moe|--ep 2 --oracle reshard --target-tp 1 --target-tp 2 --target-tp 4 --target-ep 2
reshard-tp2-wrong-row|tiny:qwen3|--tp 2 --oracle reshard --target-tp 1 --hook $M.reshard:wrong_row_source
reshard-ep2-local-id|tiny:qwen3-moe|--ep 2 --oracle reshard --target-tp 1 --target-ep 2 --hook $M.reshard:local_expert_id
reshard-tp2etp2|tiny:qwen3-moe|--tp 2 --etp 2 --oracle reshard --target-tp 1 --target-tp 2 --target-ep 1 --target-ep 2 --target-etp 1 --target-etp 2
reshard-tp2etp2-wrong-etp-rank|tiny:qwen3-moe|--tp 2 --etp 2 --oracle reshard --target-tp 2 --target-etp 1 --hook $M.reshard:expert_row_wrong_etp_source
sync-tp2|tiny:qwen3-moe|--tp 2 --oracle receiver,idempotence,delta,broadcast --receiver fused --chunk-mb 0.05
sync-ep2-bucketed|tiny:qwen3-moe|--ep 2 --oracle roundtrip,receiver,broadcast --sender bucketed --chunk-mb 0.05
sync-tp2-truncated|tiny:qwen3-moe|--tp 2 --oracle broadcast --chunk-mb 0.05 --hook $M.sync:truncate_broadcast_chunk
sync-ep2-flip|tiny:qwen3-moe|--ep 2 --oracle roundtrip,receiver --sender $M.sync:flip_bit"
while IFS='|' read -r tag model args; do
  [ -n "$tag" ] || continue
  start=$(date +%s)
  python3 -m convcheck verify --device cuda --model "$model" $args --json "$OUT/v-$tag.json" > "$OUT/v-$tag.txt" 2>&1
  echo "== $tag ($model $args): exit $? in $(( $(date +%s) - start )) s: $(tail -1 "$OUT/v-$tag.txt")"
done <<< "${CASES:-$default_cases}"
python3 - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
reports = {os.path.basename(p)[2:-5]: json.load(open(p)) for p in sorted(glob.glob(f"{out}/v-*.json"))}
json.dump(reports, open(f"{out}/verify.json", "w"), indent=1)
with open(f"{out}/tails.txt", "w") as f:
    for p in sorted(glob.glob(f"{out}/v-*.txt")):
        f.write(f"== {os.path.basename(p)}\n" + "".join(open(p).readlines()[-25:]))
EOF
rm -f "$OUT"/v-*
[ -n "${BENCH-1}" ] || exit 0
python3 bench/bench_broadcast.py --device cuda --mib "${BCAST_MIB:-2048}" --tensors 16 --chunk-mb 64 --repeat 5 \
  > "$OUT/bench-broadcast.json"; echo "== broadcast: $(cat "$OUT/bench-broadcast.json")"
python3 bench/bench_reshard.py --device cuda --model tiny:qwen3-moe --ep 2 --target-tp 1 --target-tp 2 --target-tp 4 \
  --target-ep 2 > "$OUT/bench-reshard.json"; echo "== reshard: $(head -c 1500 "$OUT/bench-reshard.json")"
