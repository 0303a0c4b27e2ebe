// CUDA runtime probe (compiled by nvcc): device count, name, compute capability, memory.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include "kernels/cuda/cuda_probe.h"

namespace flexh2o {

bool cuda_compiled_in() { return true; }

CudaProbe probe_cuda() {
  CudaProbe p;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    p.reason = std::string("CUDA runtime: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error
    // The runtime says "driver version is insufficient" when there is no driver at all.
    if (e == cudaErrorInsufficientDriver) {
      if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) dlclose(driver);
      else p.reason = "no NVIDIA driver is installed (libcuda.so.1 cannot be loaded)";
    }
    return p;
  }
  if (n == 0) {
    p.reason = "no CUDA devices found";
    return p;
  }
  cudaDeviceProp prop{};
  e = cudaGetDeviceProperties(&prop, 0);
  if (e != cudaSuccess) {
    p.reason = std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e);
    return p;
  }
  p.available = true;
  p.device_count = n;
  p.device_name = prop.name;
  p.cc_major = prop.major;
  p.cc_minor = prop.minor;
  p.total_memory = prop.totalGlobalMem;
  return p;
}

}  // namespace flexh2o
