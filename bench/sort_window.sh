#!/usr/bin/env bash
# Length-sorted batches (`generate --sort-window`) against input order on prompts of mixed
# lengths: N requests of token-id prompts with lengths spread over [MIN, MAX] in a fixed shuffled
# order, GEN tokens each, greedy with --ignore-eos; rounds interleave the two settings. Prints
# tokens/s and padded prompt tokens of each, and the ratio.
#   bash bench/sort_window.sh [MODEL] [N] [MIN] [MAX] [GEN] [BATCH] [ROUNDS]
set -euo pipefail
MODEL=${1:-opt-125m} N=${2:-64} MIN=${3:-16} MAX=${4:-512} GEN=${5:-32} B=${6:-8} ROUNDS=${7:-2}
BIN=${BIN:-build/flexh2o}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$N" "$MIN" "$MAX" > "$tmp/in.jsonl" <<'PY'
import json, random, sys
n, lo, hi = map(int, sys.argv[1:4])
rng = random.Random(7)
lens = [lo + (hi - lo) * i // max(1, n - 1) for i in range(n)]
rng.shuffle(lens)
for i, L in enumerate(lens):
    print(json.dumps({"id": i, "prompt_ids": [4 + (13 * i + 7 * t) % 1000 for t in range(L)]}))
PY
for r in $(seq "$ROUNDS"); do
  for w in 1 8; do
    "$BIN" generate -m "$MODEL" --device cpu --input "$tmp/in.jsonl" --output "$tmp/out$w.jsonl" --overwrite \
      --report "$tmp/r$w.$r.json" -n "$GEN" -b "$B" --greedy --ignore-eos --progress never --quiet \
      --sort-window "$w" 2>/dev/null
  done
done
cmp -s "$tmp/out1.jsonl" "$tmp/out8.jsonl" && same=yes || same=NO
python3 - "$tmp" "$ROUNDS" "$MODEL" "$N" "$MIN" "$MAX" "$GEN" "$B" "$same" <<'PY'
import json, sys
tmp, rounds, model, n, lo, hi, gen, b, same = sys.argv[1:]
best = {}
for w in ("1", "8"):
    reps = [json.load(open(f"{tmp}/r{w}.{r}.json")) for r in range(1, int(rounds) + 1)]
    best[w] = max(reps, key=lambda x: x["tokens_per_s"])
print(f"{model}, {n} prompts of {lo}..{hi} tokens (shuffled) + {gen}, batch {b}, best of {rounds}; outputs equal: {same}")
for w in ("1", "8"):
    r = best[w]
    print(f"  --sort-window {w}: {r['tokens_per_s']:8.1f} tok/s, prompt tokens {r['prompt_tokens']}, "
          f"padded {r['padded_prompt_tokens']}, prefill {r['prefill_seconds']:.2f} s, decode {r['decode_seconds']:.2f} s")
print(f"  ratio (8 / 1): {best['8']['tokens_per_s'] / best['1']['tokens_per_s']:.2f}")
PY
