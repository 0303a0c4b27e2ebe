// compute_dtype(): the CUDA device's activation and weight dtype for a checkpoint (host-only).
#include "gpu/cuda_device.h"

namespace flexh2o::gpu {

DType compute_dtype(const Model& m) {
  bool bf16 = false, f16 = false;
  for (const BoundTensor& t : m.tensors()) {
    bf16 = bf16 || t.view.dtype == DType::BF16;
    f16 = f16 || t.view.dtype == DType::F16;
  }
  if (bf16) return DType::BF16;
  if (!f16 && m.config().dtype == DType::BF16) return DType::BF16;
  return DType::F16;
}

}  // namespace flexh2o::gpu
