// compute_dtype(): the CUDA device's activation and weight dtype for a checkpoint (host-only).
#include "gpu/cuda_device.h"

namespace flexh2o::gpu {

DType compute_dtype(const Model& m) {
  // Gemma's residual stream outgrows f16's range (transformers refuses float16 for Gemma 2 for
  // the same reason): bf16 whatever the checkpoint holds.
  if (m.config().model_type.starts_with("gemma")) return DType::BF16;
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
