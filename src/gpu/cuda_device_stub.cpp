// Without CUDA the CUDA device cannot be made; the CLI links the same way in every build.
#include "core/error.h"
#include "gpu/cuda_device.h"

namespace flexh2o::gpu {

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions&) {
  FH_FAIL("this build of flexh2o has no CUDA backend (nvcc was not found at build time); use --device cpu");
}

std::string cuda_unsupported(const ModelConfig&, DType) { return {}; }

}  // namespace flexh2o::gpu
