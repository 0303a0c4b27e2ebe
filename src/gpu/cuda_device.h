// The CUDA Device (engine/device.h) on one NVIDIA GPU: device memory from cudaMalloc and pinned
// host memory from cudaHostAlloc, both charged to the engine's tier budgets; three streams
// (compute, host->device, device->host) with pooled CUDA events; the disk and host queues are
// the executor's host threads; the unit ops run kernels/cuda and cuBLAS on the compute stream
// with activations in F16 (BF16 for bf16 checkpoints) and fp32 accumulation. Host-homed model
// weights are page-locked in place (read-only registration) when the driver allows it.
// No CUDA headers here: without CUDA, make_cuda_device() throws (cuda_device_stub.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/device.h"
#include "model/weights.h"

namespace flexh2o::gpu {

struct CudaDeviceOptions {
  int device = 0;
  DType compute = DType::F16;  // F16 or BF16: activations and weights (see compute_dtype())
  // Device memory the engine may budget by default: what is free less this reserve (context,
  // fragmentation). An explicit --gpu-mem replaces it.
  size_t reserve_bytes = size_t(512) << 20;
  int host_threads = 0;  // threads of the host work (host attention); <= 0: all
};

// BF16 when the checkpoint holds bf16 tensors (or config.json says bfloat16 and nothing is
// f16), F16 otherwise (f16 and f32 checkpoints; f32 is rounded to f16 on upload).
DType compute_dtype(const Model& m);

// Why the CUDA device cannot run model config `c` with activations in `compute` (its attention
// kernels are built for some head sizes only), or "" when it can. Needs no GPU; without CUDA
// compiled in it returns "" (make_cuda_device() says why instead).
std::string cuda_unsupported(const ModelConfig& c, DType compute);

// Throws Error naming the reason when CUDA is not compiled in, no GPU is usable, the dtype is
// not F16/BF16, or a CUDA call fails.
std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& o);

}  // namespace flexh2o::gpu
