#!/usr/bin/env bash
# pack_compare.sh — called by bench/gpu_pack.sh (run HERE): gathers into gpu_pack/compare/ what
# gpu_compare.sh needs on the offline GPU machine. Never committed (gpu_pack/ is ignored).
#   wheels/       flexgen 0.1.8 (PyPI) + its pure-Python deps the image may lack (attrs, tqdm; pulp is only for its policy search, not imported by flex_opt)
#   h2o_flexgen/  H2O's FlexGen fork, FMInference/H2O folder h2o_flexgen (code only, no logs,
#                 no third_party/DeepSpeed), run as a peer, not copied into our tree
#   hf_home/      an offline HF cache with a tokenizer under "facebook/opt-30b" (FlexGen loads
#                 it by that name; tests/data/tiny-opt's BPE files: prompt ids only, weights are dummy)
#   cap/sitecustomize.py  torch.cuda.set_per_process_memory_fraction(16 GiB) for every Python system
# H2O source: $H2O_GIT (a git dir; default the fetch tool's mirror) or git clone if reachable.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CP="$ROOT/gpu_pack/compare"
rm -rf "$CP"; mkdir -p "$CP/wheels" "$CP/cap"
pip download -q --no-deps -d "$CP/wheels" flexgen==0.1.8 attrs tqdm
H2O_GIT="${H2O_GIT:-/work/.mirror/FMInference+H2O/repo}"
if [ ! -d "$H2O_GIT" ]; then git clone -q --bare https://github.com/FMInference/H2O /tmp/h2o.git; H2O_GIT=/tmp/h2o.git; fi
git --git-dir="$H2O_GIT" archive HEAD h2o_flexgen/flexgen h2o_flexgen/README.md 2>/dev/null | tar -x -C "$CP"
git --git-dir="$H2O_GIT" rev-parse HEAD >"$CP/h2o_flexgen/COMMIT"
snap="$CP/hf_home/hub/models--facebook--opt-30b/snapshots/0"
mkdir -p "$snap" "$CP/hf_home/hub/models--facebook--opt-30b/refs"
# No newline: huggingface_hub reads the ref verbatim, and "0\n" names no snapshot (FlexGen and
# its H2O fork both load this tokenizer by name, whatever the model, and would stop there).
printf 0 >"$CP/hf_home/hub/models--facebook--opt-30b/refs/main"
cp "$ROOT/tests/data/tiny-opt/"{vocab.json,merges.txt,special_tokens_map.json,tokenizer_config.json,config.json} "$snap/"
cat >"$CP/cap/sitecustomize.py" <<'PY'
# Caps every Python system's CUDA memory at FLEXH2O_GPU_MEM_GIB (16) GiB, as --gpu-mem caps ours.
import os
try:
    import torch
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, float(os.environ.get("FLEXH2O_GPU_MEM_GIB", "16")) * 2**30 / total))
except Exception as e:  # never stop the system under test from starting
    print("sitecustomize: no memory cap:", e)
PY
# With a Python that has transformers (CHECK_PY=/path/to/python), the offline load the peers do.
if [ -n "${CHECK_PY:-}" ]; then
  HF_HOME="$CP/hf_home" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$CHECK_PY" -c \
    'from transformers import AutoTokenizer as T; print("pack_compare: offline tokenizer", T.from_pretrained("facebook/opt-30b", padding_side="left")("Paris").input_ids)'
  rm -f "$CP/hf_home/hub/version.txt"
fi
du -sh "$CP"
