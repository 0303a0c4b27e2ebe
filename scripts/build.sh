#!/usr/bin/env bash
# Configures and builds flexh2o into ./build (Release). Finds nvcc in /usr/local/cuda when it
# is not on PATH, so the CUDA backend is compiled whenever the toolkit is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
# The Python extension and its tests use Debian's interpreter, not whichever python3 is first
# on PATH (a pyenv or venv one would lack the Debian packages the tests import).
py=()
[ -x /usr/bin/python3 ] && py=(-DPython3_EXECUTABLE=/usr/bin/python3)
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${py[@]}" "$@" >/dev/null
cmake --build build -j "$jobs"
