#!/usr/bin/env bash
# Configures and builds flexh2o into ./build (Release). Finds nvcc in /usr/local/cuda when it
# is not on PATH, so the CUDA backend is compiled whenever the toolkit is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
