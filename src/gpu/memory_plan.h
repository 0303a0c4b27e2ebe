// What the GPU runner puts on the device, counted on the host before anything is allocated:
// the compute dtype of a checkpoint, weight bytes as uploaded, KV-cache bytes, and the
// "does not fit" message. Plain C++ (no CUDA headers): built and tested in every build.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/weights.h"

namespace flexh2o::gpu {

// Alignment of every tensor inside the weight arena (DeviceArena's default).
inline constexpr size_t kTensorAlign = 256;

// BF16 when the checkpoint holds bf16 tensors (or config.json says bfloat16 and nothing is
// f16), F16 otherwise (f16 and f32 checkpoints; f32 is rounded to f16 on upload).
DType gpu_compute_dtype(const Model& m);

// Device bytes of the weights at `dt`, each tensor aligned to kTensorAlign (a tied lm_head
// is the embedding and counted once).
size_t gpu_weight_bytes(const Model& m, DType dt);

// Device bytes of K and V for all layers: 2 * n_layers * batch * kv_heads * capacity *
// head_dim elements of `dt` (the layout of kernels/cuda/attention.h).
size_t gpu_kv_bytes(const ModelConfig& c, DType dt, int64_t batch, int64_t capacity);

// Elements [off, off+n) of weight `v` (f32/f16/bf16) converted to `dt` (F16 or BF16) into
// `out` (host memory). Throws Error on another source dtype.
void convert_weights(const TensorView& v, int64_t off, int64_t n, DType dt, uint16_t* out);

// Element counts of GpuLayerCompute's scratch tensors for steps of up to M rows and B
// sequences, in carve order: normed, q, k, v, attn, ffn_a, ffn_b (LLaMA), last row per sequence.
std::array<int64_t, 8> gpu_scratch_elems(const ModelConfig& c, int64_t M, int64_t B);
// Device bytes of that scratch at `dt`, each tensor (+1 byte) aligned to kTensorAlign.
size_t gpu_scratch_bytes(const ModelConfig& c, DType dt, int64_t M, int64_t B);

// "" when `need` <= `available`; otherwise one sentence naming `what`, the bytes needed, the
// bytes available (free of `total` on `device`) and what to do instead (`hint`).
std::string fit_error(const std::string& what, size_t need, size_t available, size_t total,
                      const std::string& device, const std::string& hint);

// 13958643712 -> "13.0 GiB" (binary units, one decimal; bytes below 1 KiB as "512 B").
std::string format_bytes(size_t bytes);

}  // namespace flexh2o::gpu
