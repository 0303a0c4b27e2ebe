#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: dependencies, build, every CTest test; then
# the parsing and I/O tests again under ASan + UBSan, and every fuzz target for 15 s.
# GPU tests (label "gpu") skip with a reason when no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-debian.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 900)
bash scripts/sanitize.sh
bash scripts/fuzz.sh
