#!/usr/bin/env bash
# cpu_compare.sh — developer tool (not CI): flexh2o on the CPU device vs Hugging Face
# transformers in memory and accelerate's disk offloading, OPT-125M/1.3B shapes, random
# weights. Sets up a venv (default /work/venv-compare; --venv DIR) and runs cpu_compare.py;
# other arguments go to it (--models, --prompt-len, --seqs, --repeats, --cap).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV=/work/venv-compare
if [[ "${1:-}" == --venv ]]; then VENV="$2"; shift 2; fi
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import torch, transformers, accelerate' 2>/dev/null; then
  python3 -m venv "$VENV"
  # PyTorch's CPU index was unreachable here (2026-12-01); plain PyPI torch works but is large.
  "$VENV/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null ||
    "$VENV/bin/pip" install -q torch
  "$VENV/bin/pip" install -q transformers accelerate safetensors
fi
cd "$ROOT"
exec "$VENV/bin/python" bench/compare/cpu_compare.py --flexh2o "${FLEXH2O:-$ROOT/build/flexh2o}" "$@"
