// Safetensors checkpoints: a single model.safetensors or a sharded set described by
// model.safetensors.index.json. Files are memory-mapped; tensors are views into the maps.
// Every header is validated (length, JSON, dtype, shape x dtype == byte size, offsets inside
// the data section and non-overlapping); any violation throws flexh2o::Error naming the file
// and the tensor. The result is the shared tensor directory (archive.h): read-only, thread-safe.
#pragma once

#include <filesystem>

#include "loader/archive.h"

namespace flexh2o {

class SafetensorsArchive : public TensorArchive {
 public:
  // dir/model.safetensors if present, else dir/model.safetensors.index.json (sharded).
  static SafetensorsArchive open_dir(const std::filesystem::path& dir);
  // One .safetensors file. Tensor data must be aligned to its element size in the file (true
  // of every file written by the safetensors library or write_safetensors); else it throws.
  static SafetensorsArchive open_file(const std::filesystem::path& file);

 private:
  void add_file(size_t i);  // parses files()[i]'s header into tensors_ (and metadata_)
};

}  // namespace flexh2o
