// Safetensors checkpoints: a single model.safetensors or a sharded set described by
// model.safetensors.index.json. Files are memory-mapped; tensors are views into the maps.
// Every header is validated (length, JSON, dtype, shape x dtype == byte size, offsets inside
// the data section and non-overlapping); any violation throws flexh2o::Error naming the file
// and the tensor. The archive owns the mappings: views die with it. Read-only, thread-safe.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "offload/mapped_file.h"

namespace flexh2o {

struct TensorEntry {
  std::string name;
  TensorView view;  // points into the mapped file
  size_t file_index = 0;  // which shard (index into SafetensorsArchive::files())
};

class SafetensorsArchive {
 public:
  // dir/model.safetensors.index.json if present (sharded), else dir/model.safetensors.
  static SafetensorsArchive open_dir(const std::filesystem::path& dir);
  // One .safetensors file. Tensor data must be aligned to its element size in the file (true
  // of every file written by the safetensors library or write_safetensors); else it throws.
  static SafetensorsArchive open_file(const std::filesystem::path& file);

  // nullptr when absent.
  const TensorEntry* find(std::string_view name) const;
  // Throws "tensor NAME missing from CHECKPOINT" when absent.
  const TensorEntry& get(std::string_view name) const;
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::vector<MappedFile>& files() const { return files_; }
  // Sum of tensor bytes.
  size_t total_bytes() const;
  // Free-form string map from the "__metadata__" header entry of the first file.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // What was opened: the .safetensors file, or the index.json of a sharded checkpoint.
  const std::filesystem::path& source() const { return source_; }

 private:
  std::filesystem::path source_;
  std::vector<MappedFile> files_;
  std::vector<TensorEntry> tensors_;  // sorted by name
  std::map<std::string, std::string> metadata_;
};

}  // namespace flexh2o
