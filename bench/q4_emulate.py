#!/usr/bin/env python3
# Developer tool: applies core/quant4.h (4-bit, groups along the last dim, fp16 d and m, x = q*d + m)
# in numpy to every 2-D tensor of a safetensors checkpoint and writes the dequantized copy, so an
# uncompressed eval-ppl of it checks --compress-weight (same perplexity) and tries other group sizes.
#   python3 bench/q4_emulate.py SRC_DIR DST_DIR GROUP     (needs numpy, safetensors)
import sys, json, shutil, os, numpy as np
from safetensors.numpy import load_file, save_file
src, dst, g = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst, exist_ok=True)
for f in os.listdir(src):
    if f != 'model.safetensors': shutil.copy(os.path.join(src, f), dst)
t = load_file(os.path.join(src, 'model.safetensors'))
out = {}
err = []
for k, w in t.items():
    if w.ndim != 2: out[k] = w; continue
    w32 = w.astype(np.float32)
    R, C = w32.shape
    pad = (-C) % g
    x = np.pad(w32, ((0, 0), (0, pad)), constant_values=np.nan).reshape(R, -1, g)
    mn = np.nanmin(x, axis=2, keepdims=True); mx = np.nanmax(x, axis=2, keepdims=True)
    m = mn.astype(np.float16).astype(np.float32)
    d = ((mx - m) / np.float32(15)).astype(np.float16).astype(np.float32)
    with np.errstate(divide='ignore', invalid='ignore'):
        q = np.where(d == 0, 0, np.clip(np.rint((x - m) / d), 0, 15))
    y = (q * d + m).reshape(R, -1)[:, :C].astype(np.float32)
    out[k] = y.astype(w.dtype)
    err.append((k, float(np.sqrt(np.mean((y - w32) ** 2)) / (np.sqrt(np.mean(w32 ** 2)) + 1e-30))))
save_file(out, os.path.join(dst, 'model.safetensors'))
err.sort(key=lambda e: -e[1])
print('worst rel rms err', err[:4]); print('mean rel rms err', np.mean([e[1] for e in err]))
