// What the checkpoint fuzz targets (safetensors, torch_checkpoint) check of an archive that
// opened: every tensor view lies inside its mapped file, and its first and last bytes can be
// read (a view past the mapping would fault or be reported by ASan).
#pragma once

#include <cstddef>

#include "fuzz_util.h"
#include "loader/archive.h"

namespace flexh2o::fuzz {

inline void check_views(const TensorArchive& a) {
  const MappedFile& f = a.files().at(0);
  const auto* begin = reinterpret_cast<const std::byte*>(f.data());
  unsigned sum = 0;
  for (const TensorEntry& t : a.tensors()) {
    const auto* p = static_cast<const std::byte*>(t.view.data);
    const size_t n = t.view.nbytes();
    if (p < begin || p + n > begin + f.size()) finding("a tensor view lies outside its file");
    if (n > 0) sum += unsigned(p[0]) + unsigned(p[n - 1]);
  }
  (void)a.total_bytes();
  // Keep the reads: the compiler may not drop them.
  asm volatile("" : : "r"(sum));
}

}  // namespace flexh2o::fuzz
