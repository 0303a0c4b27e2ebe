#!/usr/bin/env bash
# gpu_pack.sh — run HERE (the CPU development machine, Debian) before a GPU session. The H200
# image has CUDA, CMake and ninja but none of our Debian libraries, and device time is short, so
# this packs into gpu_pack/ (git-ignored, a few MiB) what bench/gpu_check.sh needs there:
#   gpu_pack/build.tar.gz  the GPU-check binaries built here for sm_90, at their build-tree paths
#                    (unpacked into gpu_pack/build/ by gpu_session.sh / gpu_check.sh there)
#   gpu_pack/lib/    every shared library they load that the image may lack (all but glibc,
#                    libstdc++/libgcc_s and CUDA's): oneTBB, liburing, PCRE2, Open MPI, ...; checked
#                    below by resolving each binary against gpu_pack/lib and those alone
#   gpu_pack/debs/   the -dev .debs, so gpu_check.sh can build there if the binaries do not run
#   gpu_pack/source_root  the absolute source path baked into the binaries (test data, configs)
#   gpu_pack/compare/  what bench/compare/gpu_compare.sh needs (bench/compare/pack_compare.sh)
# Check it here with bench/compare/dry_run.sh; then, with the device tool:
#   run(command="bash bench/gpu_session.sh", carry=["gpu_pack"], timeout_s=600)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$ROOT/gpu_pack"
BUILD="$ROOT/build-gpupack"
export PATH="/usr/local/cuda/bin:$PATH"
JOBS="${JOBS:-$(nproc)}"
# Binaries gpu_check.sh runs (relative to a build tree).
BINS=(flexh2o tests/kernels_cuda/kernels_cuda_test bench/bench_gpu)
BINS+=(tests/gpu/gpu_engine_test)

LAUNCH=()
command -v ccache >/dev/null 2>&1 && for l in C CXX CUDA; do LAUNCH+=("-DCMAKE_${l}_COMPILER_LAUNCHER=ccache"); done
echo "gpu_pack: configure $BUILD (Release, sm_90)"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DFLEXH2O_ENABLE_CUDA=ON "${LAUNCH[@]}" >/dev/null
targets=()
for b in "${BINS[@]}"; do targets+=("$(basename "$b")"); done
echo "gpu_pack: build ${targets[*]} (-j$JOBS)"
cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}"

rm -rf "$PACK"
mkdir -p "$PACK/build" "$PACK/lib" "$PACK/debs"
for b in "${BINS[@]}"; do
  mkdir -p "$PACK/build/$(dirname "$b")"
  cp "$BUILD/$b" "$PACK/build/$b"
  # The symbol tables are of no use there and the pack travels within the tree's 64 MiB.
  strip --strip-unneeded "$PACK/build/$b"
done
# Every shared library but those the image has (glibc, the GCC runtime, CUDA's; the image's are
# newer than Debian 12's, so ours run on them). An allowlist of what to copy went stale once
# already: linking Open MPI added six libraries the image lacks.
IMAGE_LIBS='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt|libcuda)\.so'
for b in "${BINS[@]}"; do ldd "$BUILD/$b"; done | awk '/=> \//{print $1, $3}' | sort -u |
  while read -r name lib; do
    [[ "$name" =~ $IMAGE_LIBS ]] || cp -L "$lib" "$PACK/lib/"
  done
# The check: resolved against gpu_pack/lib first, each binary needs nothing outside it and the
# image's libraries.
bad=0
for b in "${BINS[@]}"; do
  while read -r name _ path _; do
    [[ "$name" =~ $IMAGE_LIBS ]] && continue
    case "$path" in "$PACK"/lib/*) ;; *) echo "gpu_pack: $b needs $name from ${path:-nowhere}, not in gpu_pack/lib"; bad=1 ;; esac
  done < <(LD_LIBRARY_PATH="$PACK/lib" ldd "$PACK/build/$b" | awk '/=>/')
done
[ "$bad" -eq 0 ] || { echo "gpu_pack: the library closure is incomplete (above)"; exit 1; }
# As root, the proof: the packed flexh2o runs a tiny model in a root that holds only glibc, the GCC
# runtime and CUDA's libraries (at the image's lib64 path), as a bare image would.
if [ "$(id -u)" -eq 0 ] && command -v chroot >/dev/null 2>&1; then
  J="$(mktemp -d)"
  mkdir -p "$J/lib/x86_64-linux-gnu" "$J/lib64" "$J/usr/local/cuda/lib64" "$J/tmp" "$J$ROOT/tests/data"
  for l in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libstdc++.so.6 libgcc_s.so.1; do
    cp -L "/lib/x86_64-linux-gnu/$l" "$J/lib/x86_64-linux-gnu/"
  done
  cp -L /lib64/ld-linux-x86-64.so.2 "$J/lib64/"
  for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    src="$(readlink -f /usr/local/cuda/lib64/$l 2>/dev/null || readlink -f /usr/local/cuda/lib/$l)"
    ln "$src" "$J/usr/local/cuda/lib64/$l" 2>/dev/null || cp "$src" "$J/usr/local/cuda/lib64/$l"
  done
  cp -al "$PACK/build" "$PACK/lib" "$J$ROOT/" 2>/dev/null || cp -a "$PACK/build" "$PACK/lib" "$J$ROOT/"
  cp -a "$ROOT/tests/data/tiny-opt" "$J$ROOT/tests/data/"
  echo '{"prompt":"In the beginning"}' >"$J/tmp/p.jsonl"
  if LD_LIBRARY_PATH="$ROOT/lib:/usr/local/cuda/lib64" chroot "$J" "$ROOT/build/flexh2o" generate \
      -m "$ROOT/tests/data/tiny-opt" -i /tmp/p.jsonl -o /tmp/o.jsonl -n 8 --greedy --device cpu >"$J/log" 2>&1 &&
      grep -q '"token_ids"' "$J/tmp/o.jsonl"; then
    echo "gpu_pack: the packed flexh2o ran tiny-opt in a bare root"
  else
    cat "$J/log"; rm -rf "$J"
    echo "gpu_pack: the packed flexh2o does not run in a bare root (above)"; exit 1
  fi
  rm -rf "$J"
fi
echo "$ROOT" >"$PACK/source_root"
# The binaries travel compressed (about a third of their bytes, so the .debs fit beside the tree);
# gpu_session.sh and gpu_check.sh unpack build.tar.gz into gpu_pack/build first.
tar -C "$PACK" -czf "$PACK/build.tar.gz" build && rm -rf "$PACK/build"
(cd "$PACK/debs" && apt-get download -q libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libhwloc15 \
  liburing-dev liburing2 libcli11-dev libgtest-dev nlohmann-json3-dev libpcre2-dev libpcre2-8-0 \
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 libxxhash-dev libxxhash0 libzstd-dev pkgconf \
  libpkgconf3 pkgconf-bin libopenmpi-dev libopenmpi3 libevent-core-2.1-7 libevent-pthreads-2.1-7 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
# The side-by-side comparison (issue #13): flexgen wheel, H2O's fork, an offline tokenizer, the memory cap.
bash "$ROOT/bench/compare/pack_compare.sh" ||
  echo "gpu_pack: the comparison pack failed (above); gpu_check.sh does not need it"
# Bytes, not disk blocks (du's default rounds every small file up to 4 KiB: 2 MiB over the tree).
kib=$(du -sk --apparent-size "$PACK" | cut -f1)
echo "gpu_pack: $((kib / 1024)) MiB"
# The device tool carries at most 64 MiB with the working tree; 1 MiB is left for what the
# session writes into the tree before the call.
tree_kib=$(git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
  du -ck --apparent-size --files0-from=- 2>/dev/null | tail -1 | cut -f1)
# The .debs are only the fallback for binaries that do not run on the image (proved above in a
# bare root): they are the first thing left out when the tree has grown.
if [ $((kib + tree_kib)) -gt $((63 * 1024)) ] && [ -d "$PACK/debs" ]; then
  echo "gpu_pack: gpu_pack ($((kib / 1024)) MiB) + the working tree ($((tree_kib / 1024)) MiB) is over 63 MiB: leaving out the fallback .debs"
  rm -rf "$PACK/debs"
  kib=$(du -sk --apparent-size "$PACK" | cut -f1)
fi
if [ $((kib + tree_kib)) -gt $((63 * 1024)) ]; then
  echo "gpu_pack: gpu_pack ($((kib / 1024)) MiB) + the working tree ($((tree_kib / 1024)) MiB) is over the 64 MiB the device tool carries"
  exit 1
fi
echo "gpu_pack: $((kib / 1024)) MiB + the working tree $((tree_kib / 1024)) MiB"
echo "gpu_pack: ready; in the window: run(command=\"bash bench/gpu_session.sh\", carry=[\"gpu_pack\"], timeout_s=600)"
