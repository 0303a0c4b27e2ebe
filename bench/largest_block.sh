#!/usr/bin/env bash
# largest_block.sh — the largest block (gpu_batch_size x num_gpu_batches) a hardware profile's
# memory holds for a model and placement, full KV cache and H2O 20%, by `flexh2o plan` (the
# engine's own memory plan). Usage:
#   bench/largest_block.sh [PROFILE] [MODEL] [GBS] [PERCENT...]   (default: h200 opt-30b 48, FlexGen's 30B policy)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FH="${FLEXH2O:-$ROOT/build/flexh2o}"
HW="${1:-h200}" MODEL="${2:-opt-30b}" GBS="${3:-48}"
shift $(($# < 3 ? $# : 3))
PCT=("$@")
[ ${#PCT[@]} -eq 0 ] && PCT=(20 80 0 100 0 100)
for kv in full h2o; do
  args=()
  [ "$kv" = h2o ] && args=(--kv-policy h2o --heavy-ratio 0.1 --recent-ratio 0.1)
  best=0 line=""
  for k in $(seq 1 64); do
    out="$("$FH" plan -m "$MODEL" --hardware "$HW" --prompt-len 512 --gen-len 32 --percent "${PCT[@]}" \
      --gpu-batch-size "$GBS" --num-gpu-batches "$k" --cpu-cache-compute "${args[@]}")"
    grep -q "fits: true" <<<"$out" || break
    best=$k
    line="$(grep -E '^throughput|^memory' <<<"$out" | tr '\n' ' ')"
  done
  echo "$MODEL on $HW, --percent ${PCT[*]}, 512+32, KV $kv: largest block $GBS x $best = $((GBS * best)); $line"
done
