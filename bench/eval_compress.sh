#!/usr/bin/env bash
# Perplexity with 4-bit compression on the tiny models (README "Accuracy with compression"):
# eval-ppl over the first N tokens of each model's reference/eval.txt, streamed one token per
# step (the data and mode of bench/eval_table.sh), for f16, W4 (--compress-weight), KV4
# (--compress-cache) and W4+KV4, each with the full cache and with H2O 20% (B = N/5 tokens,
# half heavy, half recent). Prints a Markdown table on stdout. Not a speed benchmark.
# Usage: bench/eval_compress.sh [path/to/flexh2o] [N]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$here/build/flexh2o}"
n="${2:-1024}"
models=(tiny-opt tiny-llama)
[[ -x "$bin" ]] || { echo "eval_compress.sh: no flexh2o binary at $bin (pass its path)" >&2; exit 1; }
b=$(( n / 5 )); h=$(( b / 2 ))
h2o=(--kv-policy h2o --heavy-budget "$h" --recent-budget $(( b - h )))

ppl() {  # model, flags... -> perplexity with 3 decimals
  local model="$1"; shift
  "$bin" eval-ppl --model "$here/tests/data/$model" --max-tokens "$n" --device cpu --json --streaming "$@" \
    "$here/tests/data/$model/reference/eval.txt" |
    python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["perplexity"])'
}

echo "Perplexity on the first $n tokens of tests/data/*/reference/eval.txt, one token per step;"
echo "H2O 20%: $h heavy + $(( b - h )) recent tokens."
echo
echo "| weights / KV | tiny-opt full | tiny-opt h2o 20% | tiny-llama full | tiny-llama h2o 20% |"
echo "|---|---:|---:|---:|---:|"
for mode in "f16 / f16" "W4 / f16" "f16 / KV4" "W4 / KV4"; do
  flags=()
  [[ "$mode" == W4* ]] && flags+=(--compress-weight)
  [[ "$mode" == *KV4 ]] && flags+=(--compress-cache)
  line="| $mode |"
  for m in "${models[@]}"; do
    line+=" $(ppl "$m" ${flags[@]+"${flags[@]}"}) | $(ppl "$m" ${flags[@]+"${flags[@]}"} "${h2o[@]}") |"
  done
  echo "$line"
done
