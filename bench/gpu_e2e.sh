#!/usr/bin/env bash
# gpu_e2e.sh — tiny-opt greedy tokens through the one engine on the CPU device and on a second
# device (cuda) under offloading placements, H2O, the disk tier and 4-bit compression: tokens must
# be equal. bench/gpu_check.sh sources it (its step/record/tmo, FH, OUTDIR, LOG). Alone, with the
# CPU as the second device too, it checks that every flag set still runs (a CTest, so a flag that
# stops being accepted is caught here, not in a GPU window):
#   bench/gpu_e2e.sh FLEXH2O_BINARY [DEVICE]   (DEVICE: cuda, the default, or cpu)
ALONE=0
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  ALONE=1
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  FH="${1:?usage: gpu_e2e.sh FLEXH2O_BINARY [DEVICE]}"
  E2E_DEVICE="${2:-cuda}"
  OUTDIR="$(mktemp -d)"
  trap 'rm -rf "$OUTDIR"' EXIT
  LOG="$OUTDIR/gpu_e2e.log"
  declare -a SUMMARY=()
  tmo() { echo "$1"; }
  step() { echo "== $*" >>"$LOG"; }
  record() { SUMMARY+=("$(printf '%-28s %-8s %s' "$1" "$2" "$3")"); }
fi
E2E_DEVICE="${E2E_DEVICE:-cuda}"
tok() { grep -o '"token_ids":\[[^]]*\]' "$1"; }
# e2e_tokens name tag [flags...]: greedy tokens of tiny-opt on the CPU and on E2E_DEVICE with the
# same KV flags; the second run adds the offloading flags after "--". Without them both runs take
# a batch of 4; with them the batch is their block (--gpu-batch-size x --num-gpu-batches), and
# -b beside those flags is refused.
e2e_tokens() {
  local name=$1 tag=$2
  shift 2
  local kv=() off=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do kv+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  off=("$@")
  step "$name"
  if [ ! -x "$FH" ]; then
    record "$name" FAIL "$FH not built"
    return
  fi
  local ok=1 second="$E2E_DEVICE"
  [ "$second" = cpu ] && second=cpu2
  local a="$OUTDIR/${tag}_cpu" b="$OUTDIR/${tag}_$second"
  timeout -k 10 "$(tmo 60)" "$FH" generate -m "$ROOT/tests/data/tiny-opt" -i "$E2E_IN" -o "$a.jsonl" --overwrite \
      --greedy --ignore-eos -n 24 --device cpu --report "$a.json" "${kv[@]}" --batch-size 4 >>"$LOG" 2>&1 || ok=0
  [ ${#off[@]} -eq 0 ] && off=(--batch-size 4)
  timeout -k 10 "$(tmo 60)" "$FH" generate -m "$ROOT/tests/data/tiny-opt" -i "$E2E_IN" -o "$b.jsonl" --overwrite \
      --greedy --ignore-eos -n 24 --device "$E2E_DEVICE" --report "$b.json" "${kv[@]}" "${off[@]}" >>"$LOG" 2>&1 || ok=0
  a="$a.jsonl" b="$b.jsonl"
  if [ $ok -eq 0 ]; then
    record "$name" FAIL "a generate run failed (see $LOG)"
  elif [ "$(tok "$a" | wc -l)" -ne 5 ]; then
    record "$name" FAIL "$(tok "$a" | wc -l) of 5 prompts have tokens"
  elif diff <(tok "$a") <(tok "$b") >>"$LOG" 2>&1; then
    record "$name" ok "$(tok "$b" | wc -l) prompts, tokens equal"
  else
    record "$name" FAIL "greedy tokens differ in $(diff <(tok "$a") <(tok "$b") | grep -c '^>') of $(tok "$b" | wc -l) prompts (diff in $LOG)"
  fi
}
E2E_IN="$ROOT/configs/prompts/bible.jsonl"
OFFDIR="${TMPDIR:-/tmp}/flexh2o_gpu_check_store"
[ $ALONE -eq 1 ] && OFFDIR="$OUTDIR/store"
e2e_tokens "e2e tiny-opt GPU vs CPU" e2e_tiny_opt
e2e_tokens "e2e tiny-opt host cache" e2e_tiny_opt_hostkv -- --percent 20 80 0 100 0 100 --cpu-cache-compute \
  --gpu-batch-size 2 --num-gpu-batches 2
e2e_tokens "e2e tiny-opt host H2O" e2e_tiny_opt_h2o --kv-policy h2o --heavy-budget 8 --recent-budget 8 -- \
  --percent 20 80 0 100 0 100 --cpu-cache-compute --gpu-batch-size 2 --num-gpu-batches 2
e2e_tokens "e2e tiny-opt disk tier" e2e_tiny_opt_disk -- --percent 20 30 0 50 0 100 --gpu-batch-size 2 \
  --num-gpu-batches 2 --offload-dir "$OFFDIR/tiny"
# 4-bit compression (issue #12): the same greedy tokens with weights and cache compressed on
# both devices (weights streamed from the host, cache on the GPU; then H2O over a host cache).
e2e_tokens "e2e tiny-opt W4+KV4" e2e_tiny_opt_q4 --compress-weight --compress-cache -- --percent 0 100 100 0 100 0 \
  --gpu-batch-size 2 --num-gpu-batches 2
e2e_tokens "e2e tiny-opt W4+KV4 host H2O" e2e_tiny_opt_q4_h2o --compress-weight --compress-cache --kv-policy h2o \
  --heavy-budget 8 --recent-budget 8 -- --percent 20 80 0 100 0 100 --cpu-cache-compute --gpu-batch-size 2 \
  --num-gpu-batches 2
if [ $ALONE -eq 1 ]; then
  printf '%s\n' "${SUMMARY[@]}"
  if printf '%s\n' "${SUMMARY[@]}" | grep -q ' FAIL '; then cat "$LOG"; exit 1; fi
  exit 0
fi
