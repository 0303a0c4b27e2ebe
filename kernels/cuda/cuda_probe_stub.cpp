// CUDA probe for builds without nvcc: always reports "not compiled in".
#include "kernels/cuda/cuda_probe.h"

namespace flexh2o {

bool cuda_compiled_in() { return false; }

CudaProbe probe_cuda() {
  CudaProbe p;
  p.reason = "this flexh2o was built without CUDA (nvcc not found at build time)";
  return p;
}

}  // namespace flexh2o
