#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz (built in ./build-asan, clang + ASan + UBSan): each
# reproducer of a past finding (crashes/NAME/*) must now be handled cleanly, then each target
# fuzzes for a bounded time from its seed corpus (corpus/NAME), one target per core. A crash,
# sanitizer report, leak, out-of-memory (-rss_limit_mb) or slow input fails, naming the input.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build-asan
# bash scripts/fuzz.sh [-t SECONDS] [-s SEED] [NAME...]   CI: 15 s each, seed 1 (0: random), all
# bash scripts/fuzz.sh --seeds                            rewrites the seed corpora
all=(safetensors torch_checkpoint config tokenizer_json vocab_merges sentencepiece request_jsonl policy store_header)
secs=15 seed=1 seeds=0 names=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) secs="$2"; shift 2 ;;
    -s) seed="$2"; shift 2 ;;
    --seeds) seeds=1; shift ;;
    *) names+=("$1"); shift ;;
  esac
done
[ ${#names[@]} -eq 0 ] && names=("${all[@]}")

CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXH2O_ENABLE_CUDA=OFF \
  -DFLEXH2O_ASAN=ON -DFLEXH2O_FUZZ=ON -DFLEXH2O_BUILD_BENCH=OFF -DFLEXH2O_PYTHON=OFF >/dev/null
cmake --build "$dir" -j "$(nproc)" --target "${names[@]/#/fuzz_}"

if [ "$seeds" = 1 ]; then
  python3 tests/fuzz/make_seeds.py
  "$dir/fuzz/fuzz_store_header" -write_seeds=tests/fuzz/corpus/store_header
  exit 0
fi

export ASAN_OPTIONS="detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1"
work="$PWD/$dir/fuzz-runs"
opts=(-timeout=25 -rss_limit_mb=2048)
run_one() {  # NAME: replay its reproducers one by one, then fuzz from its seeds; logs in $work/NAME
  local name="$1" out="$work/$1" f status=0 dict=()
  case "$name" in
    store_header) ;;
    torch_checkpoint) dict=(-dict=tests/fuzz/pickle.dict) ;;
    sentencepiece) ;;
    *) dict=(-dict=tests/fuzz/json.dict) ;;
  esac
  mkdir -p "$out/corpus"
  for f in tests/fuzz/crashes/"$name"/*; do
    [ -f "$f" ] || continue
    local open=0
    grep -q "^$name/$(basename "$f") " tests/fuzz/crashes/OPEN && open=1
    if "$dir/fuzz/fuzz_$name" "${opts[@]}" "$f" >"$out/replay.log" 2>&1; then
      [ $open = 1 ] && echo "fuzz: $f is handled cleanly now: delete its line from tests/fuzz/crashes/OPEN"
    elif [ $open = 1 ]; then
      echo "fuzz: $f: open finding (tests/fuzz/crashes/OPEN), still fails"
    else
      echo "fuzz: $name: the reproducer $f fails again:"
      grep -v -e '^INFO:' -e '^    #' "$out/replay.log" | head -n 15
      status=1
    fi
  done
  # New inputs go to $out/corpus (kept between local runs); findings to $out/crash-* etc.
  if "$dir/fuzz/fuzz_$name" "${opts[@]}" "${dict[@]}" -max_total_time="$secs" -seed="$seed" -max_len=16384 \
       -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus" "tests/fuzz/corpus/$name" >"$out/log" 2>&1; then
    echo "fuzz: $name ok ($(grep -o 'number_of_executed_units: *[0-9]*' "$out/log" | grep -o '[0-9]*$') runs)"
  else
    echo "fuzz: $name FAILED; log $out/log, saved input(s):"
    ls "$out"/crash-* "$out"/leak-* "$out"/oom-* "$out"/timeout-* 2>/dev/null || true
    tail -n 40 "$out/log"
    status=1
  fi
  return $status
}
failed=0
running=0
for name in "${names[@]}"; do
  rm -f "$work/$name"/{crash,leak,oom,timeout}-*
  run_one "$name" &
  running=$((running + 1))
  if [ "$running" -ge "$(nproc)" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
exit $failed
