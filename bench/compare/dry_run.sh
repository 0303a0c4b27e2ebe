#!/usr/bin/env bash
# dry_run.sh — run HERE (no GPU) after bench/gpu_pack.sh, before spending a GPU window: each part
# of bench/gpu_session.sh that can run without a GPU does, so a break costs minutes here, not the
# window. Not CI (it needs torch). Usage: bench/compare/dry_run.sh PYTHON
#   PYTHON: an interpreter with torch, transformers, accelerate and psutil, best at the image's
#   versions (KINDS.md, 2026-11): python3 -m venv V && V/bin/pip install torch==2.11.0
#   transformers==5.17.0 accelerate==1.15.0 huggingface_hub==1.33.0 tokenizers==0.23.2
#   safetensors==0.8.0 psutil  (3.5 min; numpy 2.5 needs Python 3.12, any numpy 2 will do).
#   1. PyPI FlexGen and H2O's fork, from the pack, through their whole code path on the CPU with
#      CUDA stubbed (peer_dryrun.py): OPT-125M dummy, the OPT-30B rows' policy shape;
#   2. the accelerate row's dummy model builds and generates;
#   3. gpu_session.sh end to end on a stand-in nvidia-smi with a 60 s budget: every step reports,
#      rows past the budget are skipped, the table is written, at most 8 files come back.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${1:?usage: dry_run.sh PYTHON (with torch, transformers, accelerate, psutil)}"
CP="$ROOT/gpu_pack/compare"
[ -d "$CP/wheels" ] || { echo "dry_run: no $CP (run bench/gpu_pack.sh first)"; exit 1; }
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
export HF_HOME="$CP/hf_home" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$PY" -m pip install -q --upgrade --no-index --no-deps --target "$W/deps" "$CP"/wheels/*.whl || exit 1
mkdir -p "$W/noflexgen"
for d in "$W"/deps/*; do case "$(basename "$d")" in flexgen*) ;; *) ln -s "$d" "$W/noflexgen/" ;; esac; done
fail=0
peer() {  # peer NAME PYTHONPATH ARGS...
  local name=$1 pp=$2; shift 2
  if PYTHONPATH="$pp" timeout 300 "$PY" "$ROOT/bench/compare/peer_dryrun.py" flexgen.flex_opt --model facebook/opt-125m \
      --path _DUMMY_ --prompt-len 64 --gen-len 4 --offload-dir "$W/off" --log-file "$W/$name.log" "$@" >"$W/$name.out" 2>&1 &&
      grep -q "total throughput" "$W/$name.log" && grep -q "projected: True" "$W/$name.log"; then
    echo "dry_run: $name ran through ($*)"
  else
    tail -20 "$W/$name.out"; echo "dry_run: $name FAILED ($*)"; fail=1
  fi
}
# --cut-gen-len as the OPT-30B rows use it (FlexGen projects the decode steps it skips).
POL=(--percent 20 80 0 100 0 100 --cpu-cache-compute --gpu-batch-size 4 --num-gpu-batches 2 --cut-gen-len 2)
peer flexgen "$W/deps" "${POL[@]}"
peer h2o-flexgen "$CP/h2o_flexgen:$W/noflexgen" "${POL[@]}" --hh-ratio 0.1 --hh-all
if PYTHONPATH="$ROOT/bench/compare" timeout 300 "$PY" -c '
import torch, hf_accelerate_gpu as h
m = h.dummy_model("opt-125m"); ids = torch.randint(4, 50000, (2, 16))
out = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=3, min_new_tokens=3)
assert out.shape == (2, 19), out.shape' >"$W/acc.out" 2>&1; then
  echo "dry_run: the accelerate row's dummy model generates"
else
  cat "$W/acc.out"; echo "dry_run: the accelerate row's dummy model FAILED"; fail=1
fi
mkdir -p "$W/bin" "$W/out"
cat >"$W/bin/nvidia-smi" <<'SH'
#!/bin/sh
case "$*" in *-L*) echo "GPU 0: stand-in (dry run)";; *noheader*) echo "stand-in GPU";; *) echo "name"; echo "stand-in GPU";; esac
SH
chmod +x "$W/bin/nvidia-smi"
PATH="$W/bin:$PATH" OUT="$W/out" PY="$PY" FLEXH2O_SESSION_BUDGET=60 COMPARE_ROWS="$W/rows.csv" timeout 200 \
  bash "$ROOT/bench/gpu_session.sh" all >"$W/session.out" 2>&1
files=$(find "$W/out" -type f | wc -l)
rows=$(($(wc -l <"$W/out/compare/gpu_compare.csv" 2>/dev/null || echo 1) - 1))
if grep -q "gpu_check summary" "$W/session.out" && grep -q "gpu_session: .* s in all" "$W/session.out" &&
    [ "$files" -le 8 ] && [ "$rows" -eq 9 ] && [ -s "$W/out/compare/gpu_compare.md" ]; then
  echo "dry_run: gpu_session.sh ran end to end ($files files back, $rows table rows)"
else
  tail -30 "$W/session.out"; echo "dry_run: gpu_session.sh FAILED ($files files, $rows rows)"; fail=1
fi
# A window's two calls: part A, then part B on the same machine, whose table holds both calls' rows.
for part in A B; do
  rm -rf "$W/out"; mkdir -p "$W/out"
  PATH="$W/bin:$PATH" OUT="$W/out" PY="$PY" FLEXH2O_SESSION_BUDGET=40 COMPARE_ROWS="$W/rows_ab.csv" timeout 200 \
    bash "$ROOT/bench/gpu_session.sh" "$part" >"$W/session_$part.out" 2>&1
  rows=$(($(wc -l <"$W/out/compare/gpu_compare.csv" 2>/dev/null || echo 1) - 1))
  want=3; [ "$part" = B ] && want=4
  if [ "$rows" -eq "$want" ] && grep -q "part $part;" "$W/out/compare/gpu_compare.md"; then
    echo "dry_run: part $part ran ($rows rows so far)"
  else
    tail -20 "$W/session_$part.out"; echo "dry_run: part $part FAILED ($rows rows, want $want)"; fail=1
  fi
done
[ $fail -eq 0 ] && echo "dry_run: all parts ran" || echo "dry_run: a part failed (above)"
exit $fail
