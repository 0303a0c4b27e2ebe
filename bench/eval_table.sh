#!/usr/bin/env bash
# Perplexity vs KV budget on the tiny models (README table): eval-ppl over the first N tokens of
# each model's reference/eval.txt, streamed one token per step, for the full cache and for
# local / sinks / h2o / random at 10%, 20% and 50% of N. Prints a Markdown table on stdout.
# Not a speed benchmark. Usage: bench/eval_table.sh [path/to/flexh2o] [N]
#
# Budget B = floor(pct * N) tokens that attention may see per step (the new token included):
#   local  --recent-budget B             sinks  --sink-tokens 4 --recent-budget B-4
#   h2o    --heavy-budget B/2 --recent-budget B-B/2 (H2O's "heavy = recent" split)
#   random the same split, heavy part drawn at random (--kv-seed 0)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$here/build/flexh2o}"
n="${2:-1024}"
models=(tiny-opt tiny-llama)
[[ -x "$bin" ]] || { echo "eval_table.sh: no flexh2o binary at $bin (pass its path)" >&2; exit 1; }

ppl() {  # model, flags... -> perplexity with 3 decimals
  local model="$1"; shift
  "$bin" eval-ppl --model "$here/tests/data/$model" --max-tokens "$n" --device cpu --json "$@" \
    "$here/tests/data/$model/reference/eval.txt" |
    python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["perplexity"])'
}

row() {  # label, flags...
  local label="$1"; shift
  local line="| $label |"
  for m in "${models[@]}"; do line+=" $(ppl "$m" "$@") |"; done
  echo "$line"
}

echo "Perplexity on the first $n tokens of tests/data/*/reference/eval.txt (KJV Colossians), BOS"
echo "prepended, fed one token per decode step; budget = tokens attention sees per step (of $n)."
echo
echo "| KV policy (budget) | ${models[0]} | ${models[1]} |"
echo "|---|---:|---:|"
row "full" --streaming
for pct in 10 20 50; do
  b=$(( n * pct / 100 ))
  h=$(( b / 2 ))
  row "local $pct% ($b)" --kv-policy local --recent-budget "$b"
  row "sinks $pct% (4 + $((b - 4)))" --kv-policy sinks --sink-tokens 4 --recent-budget $((b - 4))
  row "h2o $pct% ($h + $((b - h)))" --kv-policy h2o --heavy-budget "$h" --recent-budget $((b - h))
  row "random $pct% ($h + $((b - h)))" --kv-policy random --heavy-budget "$h" --recent-budget $((b - h)) --kv-seed 0
done

# Multiple choice (H2O's lm-eval setting: 5-shot, budgets as fractions of each item's prompt).
choice() {  # model, flags... -> "acc / acc_norm"
  local model="$1"; shift
  "$bin" eval-choice --model "$here/tests/data/$model" --tasks "$here/tests/data/tasks/bible_cloze.jsonl" \
    --num-fewshot 5 --device cpu --json "$@" |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.2f / %.2f" % (j["acc"], j["acc_norm"]))'
}
crow() {
  local label="$1"; shift
  local line="| $label |"
  for m in "${models[@]}"; do line+=" $(choice "$m" "$@") |"; done
  echo "$line"
}
echo
echo "bible_cloze (tests/data/tasks, 50 items, 4 choices, chance 0.25), 5-shot, acc / acc_norm (per token);"
echo "ratios are of each item's prompt (5 solved examples + the item)."
echo
echo "| KV policy (budget) | ${models[0]} | ${models[1]} |"
echo "|---|---:|---:|"
crow "full"
crow "local 20%" --kv-policy local --recent-ratio 0.2
crow "sinks 4 + 20%" --kv-policy sinks --sink-tokens 4 --recent-ratio 0.2
crow "h2o 10% + 10%" --kv-policy h2o --heavy-ratio 0.1 --recent-ratio 0.1
crow "random 10% + 10%" --kv-policy random --heavy-ratio 0.1 --recent-ratio 0.1 --kv-seed 0
