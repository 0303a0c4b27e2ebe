#!/usr/bin/env bash
# gpu_pack.sh — run HERE (the CPU development machine, Debian) before a GPU session. The H200
# image has CUDA, CMake and ninja but none of our Debian libraries, and device time is short, so
# this packs into gpu_pack/ (git-ignored, a few MiB) what bench/gpu_check.sh needs there:
#   gpu_pack/build/  the GPU-check binaries built here for sm_90, at their build-tree paths
#   gpu_pack/lib/    the non-CUDA shared libraries they load (oneTBB, liburing, PCRE2, xxhash)
#   gpu_pack/debs/   the -dev .debs, so gpu_check.sh can build there if the binaries do not run
#   gpu_pack/source_root  the absolute source path baked into the binaries (test data, configs)
#   gpu_pack/compare/  what bench/compare/gpu_compare.sh needs (bench/compare/pack_compare.sh)
# Then, with the device tool: run(command="bash bench/gpu_check.sh", carry=["gpu_pack"]).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$ROOT/gpu_pack"
BUILD="$ROOT/build-gpupack"
export PATH="/usr/local/cuda/bin:$PATH"
JOBS="${JOBS:-$(nproc)}"
# Binaries gpu_check.sh runs (relative to a build tree).
BINS=(flexh2o tests/kernels_cuda/kernels_cuda_test bench/bench_gpu)
BINS+=(tests/gpu/gpu_engine_test)

echo "gpu_pack: configure $BUILD (Release, sm_90)"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DFLEXH2O_ENABLE_CUDA=ON >/dev/null
targets=()
for b in "${BINS[@]}"; do targets+=("$(basename "$b")"); done
echo "gpu_pack: build ${targets[*]} (-j$JOBS)"
cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}"

rm -rf "$PACK"
mkdir -p "$PACK/build" "$PACK/lib" "$PACK/debs"
for b in "${BINS[@]}"; do
  mkdir -p "$PACK/build/$(dirname "$b")"
  cp "$BUILD/$b" "$PACK/build/$b"
done
# Shared libraries from Debian packages (not glibc/libstdc++, not CUDA: the image has those).
for b in "${BINS[@]}"; do ldd "$BUILD/$b"; done | awk '/=> \//{print $3}' | sort -u |
  grep -E 'libtbb|liburing|libpcre2|libutf8proc|libxxhash|libhwloc' | while read -r lib; do cp -L "$lib" "$PACK/lib/"; done
echo "$ROOT" >"$PACK/source_root"
(cd "$PACK/debs" && apt-get download -q libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libhwloc15 \
  liburing-dev liburing2 libcli11-dev libgtest-dev nlohmann-json3-dev libpcre2-dev libpcre2-8-0 \
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 libxxhash-dev libxxhash0 libzstd-dev pkgconf \
  libpkgconf3 pkgconf-bin 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
# The side-by-side comparison (issue #13): flexgen wheel, H2O's fork, an offline tokenizer, the memory cap.
bash "$ROOT/bench/compare/pack_compare.sh" ||
  echo "gpu_pack: the comparison pack failed (above); gpu_check.sh does not need it"
du -sh "$PACK"
echo "gpu_pack: ready; carry gpu_pack with bench/gpu_check.sh, and with bench/compare/gpu_compare.sh (its own call)"
