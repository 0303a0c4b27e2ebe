#!/usr/bin/env bash
# Developer check (not CI): runs lm-evaluation-harness with `--model flexh2o` on tiny-opt and
# tiny-llama (full cache, H2O 10%+10%, H2O with an offloading --percent) over the local tasks in
# tests/data/tasks/lm_eval/, and compares every number with flexh2o's own eval-choice, eval-ppl
# and generate on the same items (bench/lm_eval_check.py). No downloads besides the venv.
# Usage: bash bench/lm_eval_check.sh [MODEL_DIR ...]   (env: LMEVAL_VENV, BUILD, OUT)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LMEVAL_VENV:-/work/venvs/lmeval}
BUILD=${BUILD:-build}

if [ ! -x "$VENV/bin/lm_eval" ]; then
  echo "creating $VENV (pip install lm-eval 0.4.13)" >&2
  py=/usr/bin/python3  # the interpreter scripts/build.sh builds the extension for
  [ -x "$py" ] || py=python3
  "$py" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q 'lm-eval==0.4.13'
fi
if ! ls "$BUILD"/python/flexh2o/_flexh2o*.so >/dev/null 2>&1 || [ ! -x "$BUILD/flexh2o" ]; then
  echo "build the CLI and the Python extension first: cmake --build $BUILD --target flexh2o _flexh2o" >&2
  exit 2
fi
# The venv's Python must be the one the extension was built for.
ext_py=$(basename "$BUILD"/python/flexh2o/_flexh2o*.so | sed -n 's/.*cpython-\([0-9]\)\([0-9]*\).*/\1.\2/p')
venv_py=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ -n "$ext_py" ] && [ "$ext_py" != "$venv_py" ]; then
  echo "$BUILD's extension is for Python $ext_py, $VENV has $venv_py" >&2
  exit 2
fi

export PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
args=(--binary "$BUILD/flexh2o")
[ -n "${OUT:-}" ] && args+=(--out "$OUT")
exec "$VENV/bin/python" bench/lm_eval_check.py "${args[@]}" "$@"
