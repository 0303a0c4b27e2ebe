#!/usr/bin/env bash
# gpu_session.sh — the device calls a 15-minute GPU window affords (machine start included):
#   part A (the first call, 600 s):
#   1. bench/gpu_check.sh --quick: preflight, the packed binaries, every gpu test (CUDA kernels and
#      the engine on the CUDA device against the CPU), tiny-opt greedy tokens GPU vs CPU;
#   2. bench/compare/gpu_compare.sh part A in the time left: flexh2o and FlexGen at OPT-30B with
#      the full cache, H2O's FlexGen fork with H2O, each capped so the table always prints.
#   part B (a second call at once, while the machine is warm: the first leaves about 240 s of the
#   window, under the 4 minutes a fresh machine needs, so only a warm one takes it): the
#   comparison's part B (flexh2o's H2O row), then the host's profile (`flexh2o profile`: its
#   KV-decision rate on all its cores), timeout_s 190. Part C: the rest
#   (accelerate, OPT-6.7B), in a later window. See gpu_compare.sh for the parts.
# The comparison runs even when a check fails: the peers' numbers stand on their own.
# Before the window, here: bash bench/gpu_pack.sh. Then, with the device tool:
#   run(command="bash bench/gpu_session.sh", carry=["gpu_pack"], timeout_s=600)
#   run(command="bash bench/gpu_session.sh B", carry=["gpu_pack"], timeout_s=190)   (at once)
# Outputs (at most 8 files come back): $OUT/check/{gpu_check.log,ctest_gpu.txt,gpu_check_files.tar.gz,
# host_profile.json (parts B, C)},
# $OUT/compare/{gpu_compare.csv,gpu_compare.md,gpu_compare.log,gpu_compare_files.tar.gz}.
# bench/gpu_check.sh without --quick (bench_gpu, the OPT-1.3B/6.7B/30B timing rows) is a window of its own.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PART="${1:-A}"
case "$PART" in A | B | C | all) ;; *) echo "gpu_session: the part is A, B, C or all, not '$PART'"; exit 2 ;; esac
TOTAL="${FLEXH2O_SESSION_BUDGET:-575}"
[ "$PART" = B ] && TOTAL="${FLEXH2O_SESSION_BUDGET:-175}"
T0=$SECONDS
BASE="${OUT:-$ROOT/gpu_session_out}"
mkdir -p "$BASE/check" "$BASE/compare"
# gpu_pack.sh ships the binaries as build.tar.gz (the device tool's 64 MiB): unpacked here once,
# for the checks and the comparison.
P="$ROOT/gpu_pack"
if [ -f "$P/build.tar.gz" ] && [ ! -d "$P/build" ]; then tar -C "$P" -xzf "$P/build.tar.gz"; fi
[ -d "$ROOT/gpu_pack/build" ] || echo "gpu_session: no gpu_pack/ (run bench/gpu_pack.sh here first); gpu_check.sh will build"
check_rc=0
if [ "$PART" = A ] || [ "$PART" = all ]; then
  OUT="$BASE/check" FLEXH2O_GPU_CHECK_BUDGET="${FLEXH2O_CHECK_BUDGET:-210}" bash "$ROOT/bench/gpu_check.sh" --quick
  check_rc=$?
fi
left=$((TOTAL - (SECONDS - T0)))
# Parts B and C end with the host's own profile (about 6 s), so 20 s are kept for it.
[ "$PART" != A ] && left=$((left - 20))
echo ""
echo "== gpu_session: checks done in $((SECONDS - T0)) s (rc $check_rc); the comparison gets $left s"
OUT="$BASE/compare" BUDGET="$left" PART="$PART" bash "$ROOT/bench/compare/gpu_compare.sh"
# The host's rates, above all its KV-policy decisions, which configs/hardware/h200.json takes
# from the H100 run's one-thread decisions: the profile's JSON goes back on its own, its rate into
# the call's output.
if [ "$PART" != A ] && [ -x "$P/build/flexh2o" ]; then
  if LD_LIBRARY_PATH="$P/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout -k 5 20 \
    "$P/build/flexh2o" profile --name gpu-host --output "$BASE/check/host_profile.json" >/dev/null 2>&1; then
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1]))
print("== gpu_session: host profile on", sys.argv[2], "threads: KV decisions", j["host_kv_policy"])' \
      "$BASE/check/host_profile.json" "$(nproc)"
  else
    echo "== gpu_session: the host profile failed or passed 20 s (rc $?)"
  fi
fi
echo "== gpu_session: $((SECONDS - T0)) s in all; checks rc $check_rc"
exit "$check_rc"
