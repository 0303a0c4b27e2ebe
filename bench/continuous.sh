#!/usr/bin/env bash
# Continuous batching (`generate --continuous`) against static batches where answers end at
# EOS after lengths nobody knows in advance: N chat prompts (ChatML, as SmolLM2-Instruct and
# other ChatML models expect) asking for one word, a sentence, a list or a poem, sampled at
# temperature 0.7 up to GEN tokens; rounds interleave the two settings. Prints tokens/s (FlexGen's
# rule: generated / (prefill + decode)), token steps and refills of each, the ratio, and whether
# the outputs are byte-identical. MODEL: an HF directory with a ChatML tokenizer (for example
# SmolLM2-135M-Instruct from ../shared/tools/smollm2_from_gguf.py).
#   bash bench/continuous.sh MODEL [N] [GEN] [BATCH] [ROUNDS] [extra generate flags...]
set -euo pipefail
MODEL=$1 N=${2:-64} GEN=${3:-256} B=${4:-16} ROUNDS=${5:-2}
shift $(( $# < 5 ? $# : 5 ))
BIN=${BIN:-build/flexh2o}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$N" > "$tmp/in.jsonl" <<'PY'
import json, sys
n = int(sys.argv[1])
asks = ["Answer with one word: what color is the sky on a clear day?",
        "In one sentence, what is {}?",
        "List three facts about {}.",
        "Write a short poem about {}.",
        "Explain {} to a child in a few sentences.",
        "What is the capital of {}? Answer briefly."]
topics = ["the moon", "bread", "rivers", "France", "music", "gravity", "Japan", "cats", "the ocean", "winter",
          "volcanoes", "Brazil", "honey", "trains", "Canada", "stars"]
for i in range(n):
    q = asks[i % len(asks)].format(topics[(i * 5) % len(topics)])
    text = f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
    print(json.dumps({"id": i, "prompt": text}))
PY
for r in $(seq "$ROUNDS"); do
  for mode in static continuous; do
    flag=$([ "$mode" = continuous ] && echo --continuous || true)
    "$BIN" generate -m "$MODEL" --device cpu --input "$tmp/in.jsonl" --output "$tmp/$mode.jsonl" --overwrite \
      --report "$tmp/$mode.$r.json" -n "$GEN" -b "$B" --temperature 0.7 --seed 1 --progress never --quiet \
      $flag "$@" 2>/dev/null
  done
done
cmp -s "$tmp/static.jsonl" "$tmp/continuous.jsonl" && same=yes || same=NO
python3 - "$tmp" "$ROUNDS" "$MODEL" "$N" "$GEN" "$B" "$same" <<'PY'
import json, sys
tmp, rounds, model, n, gen, b, same = sys.argv[1:]
best = {}
for m in ("static", "continuous"):
    reps = [json.load(open(f"{tmp}/{m}.{r}.json")) for r in range(1, int(rounds) + 1)]
    best[m] = max(reps, key=lambda x: x["tokens_per_s"])
lens = [len(json.loads(l)["token_ids"]) for l in open(f"{tmp}/static.jsonl")]
print(f"{model}: {n} chat prompts, up to {gen} tokens (EOS ended {sum(l < int(gen) for l in lens)}; lengths "
      f"{min(lens)}..{max(lens)}, mean {sum(lens) / len(lens):.0f}), batch {b}, best of {rounds}; outputs equal: {same}")
for m in ("static", "continuous"):
    r = best[m]
    print(f"  {m:10s} {r['tokens_per_s']:8.1f} tok/s, {r['decode_steps']} decode steps, {r['refills']} refills, "
          f"prefill {r['prefill_seconds']:.2f} s, decode {r['decode_seconds']:.2f} s")
print(f"  continuous / static: {best['continuous']['tokens_per_s'] / best['static']['tokens_per_s']:.2f}")
PY
