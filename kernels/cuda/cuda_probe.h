// Asks the CUDA runtime whether a usable GPU is present. Never throws: a build without
// CUDA, a machine without a driver, or without devices all come back as available=false
// with a human-readable reason. Thread-safe; cheap enough to call once at start.
#pragma once

#include <cstddef>
#include <string>

namespace flexh2o {

struct CudaProbe {
  bool available = false;
  int device_count = 0;
  std::string reason;       // why not available (empty when available)
  std::string device_name;  // device 0
  int cc_major = 0, cc_minor = 0;
  size_t total_memory = 0;  // bytes, device 0
};

CudaProbe probe_cuda();
// True when this binary contains the CUDA backend (nvcc was found at build time).
bool cuda_compiled_in();

}  // namespace flexh2o
