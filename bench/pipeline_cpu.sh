#!/usr/bin/env bash
# Pipeline parallelism on the CPU device, measured beside the planner's prediction in the same
# run: a single process, then mpirun over 2 and 3 stages (one and S groups in flight) of a
# preset model with dummy weights. Prints per run the tokens/s (measured and predicted), the
# bubble fraction (measured: 1 - stage busy / wall; predicted: planner/pipeline.h's formula on
# this machine's profile, measured first), and the bytes sent between stages.
# Usage: bench/pipeline_cpu.sh [MODEL (default opt-125m)] [REQUESTS (default 48)] [GEN (default 16)]
# Environment: MPI_ARGS adds mpirun options (e.g. "--mca btl tcp,self": ranks talk over TCP as
# between machines, instead of shared memory); BIN another flexh2o binary (default build/flexh2o).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-opt-125m}
requests=${2:-48}
gen=${3:-16}
bin=${BIN:-build/flexh2o}
[ -x "$bin" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "needs Open MPI's mpirun (scripts/setup-debian.sh)" >&2; exit 1; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi=(mpirun --oversubscribe ${MPI_ARGS:-})
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)

# Prompts of 32 to 95 token ids (the presets have no tokenizer).
for i in $(seq 0 $((requests - 1))); do
  n=$((32 + (i * 37) % 64))
  ids=$(seq -s, $((100 + i)) $((100 + i + n - 1)))
  echo "{\"id\": $i, \"prompt_ids\": [$ids], \"max_new_tokens\": $gen}"
done > "$tmp/in.jsonl"

echo "== machine: $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "== profile (threads 1, as each rank runs)"
"$bin" profile --threads 1 --name this-machine -o "$tmp/hw.json" 2>/dev/null

common=(generate -m "$model" -i "$tmp/in.jsonl" -q --greedy --ignore-eos --threads 1 -b 8 --device cpu
        --policy auto --hardware "$tmp/hw.json")
"$bin" "${common[@]}" -o "$tmp/one.jsonl" --report "$tmp/one.json" 2>/dev/null
one=$(jq '.tokens_per_s' "$tmp/one.json")
printf '%-16s %10s %10s %8s %9s %9s %12s\n' run "tok/s" predicted ratio bubble predicted "stage bytes"
printf '%-16s %10.1f %10s %8s %9s %9s %12s\n' "1 process" "$one" - - - - -
for s in 2 3; do
  for g in 1 "$s"; do
    "${mpi[@]}" -np "$s" "$bin" "${common[@]}" --pipeline-stages "$s" --pipeline-groups "$g" \
      -o "$tmp/p.jsonl" --overwrite --report "$tmp/p.json" 2>/dev/null
    cmp -s <(jq -c .token_ids "$tmp/one.jsonl") <(jq -c .token_ids "$tmp/p.jsonl") ||
      echo "  (tokens differ from one process: the stages' plans chose another policy)"
    jq -r --arg run "S=$s G=$g" '[$run, .tokens_per_s, .pipeline.predicted_tokens_per_s,
        (.tokens_per_s / .pipeline.predicted_tokens_per_s), .pipeline.bubble_fraction,
        .pipeline.predicted_bubble_fraction, .pipeline.bytes_between_stages] |
        "\(.[0])|\(.[1])|\(.[2])|\(.[3])|\(.[4])|\(.[5])|\(.[6])"' "$tmp/p.json" |
      awk -F'|' '{printf "%-16s %10.1f %10.1f %8.2f %9.3f %9.3f %12d\n", $1, $2, $3, $4, $5, $6, $7}'
  done
done
