#!/usr/bin/env bash
# Checks an ELF file's RPATH/RUNPATH (CTest: binary_run_path_is_absolute): every entry an absolute
# directory, none empty. The loader reads an empty entry (a leading, trailing or doubled ':') as
# the working directory, so a library planted where the binary runs would be loaded.
set -euo pipefail
path=$(readelf -d "$1" | sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]/\1/p')
echo "run path of $1: ${path:-(none)}"
[ -z "$path" ] && exit 0
case ":$path:" in *::*) echo "an empty entry: the working directory"; exit 1 ;; esac
IFS=: read -ra dirs <<< "$path"
for d in "${dirs[@]}"; do
  case $d in /*) ;; *) echo "not an absolute directory: $d"; exit 1 ;; esac
done
