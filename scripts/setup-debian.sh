#!/usr/bin/env bash
# Installs flexh2o's build dependencies from Debian packages (idempotent: skips apt when all
# are present). The CUDA toolkit (nvcc, cuBLAS) is optional and not installed here. clang and
# its compiler-rt (libFuzzer, ASan, UBSan) build the fuzz targets and the sanitizer tests;
# pybind11 and the Python 3 headers the Python extension, pytest and jinja2 its tests; Open MPI
# (mpirun and its headers) the data and pipeline parallel runs (src/dist).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libtbb-dev liburing-dev libzstd-dev libcli11-dev
      libgtest-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libxxhash-dev libopenblas-dev clang libclang-rt-dev
      pybind11-dev python3-dev python3-pytest python3-jinja2 python3-venv
      openmpi-bin libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all Debian packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
