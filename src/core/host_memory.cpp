// available_host_memory(): MemAvailable from /proc/meminfo.
#include "core/host_memory.h"

#include <fstream>
#include <sstream>
#include <string>

namespace flexh2o {

std::optional<uint64_t> available_host_memory() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream in(line.substr(13));
    uint64_t kib = 0;
    std::string unit;
    if (in >> kib >> unit && unit == "kB") return kib * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace flexh2o
