// The current CUDA device in words and bytes (name, total and free memory), for error
// messages and run reports. Host code; throws Error on a CUDA failure. CUDA builds only.
#pragma once

#include <cstddef>
#include <string>

namespace flexh2o::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;
  size_t total_bytes = 0, free_bytes = 0;
};

DeviceInfo current_device_info();

}  // namespace flexh2o::gpu
