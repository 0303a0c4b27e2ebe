// The tensor directory every checkpoint format fills: tensor names mapped to views into
// memory-mapped files (safetensors.h and torch_checkpoint.h build it; checkpoint.h picks the
// format of a model directory). The archive owns the mappings: views die with it.
// Read-only after construction, so concurrent readers need no locking. Move-only.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "offload/mapped_file.h"

namespace flexh2o {

struct TensorEntry {
  std::string name;
  TensorView view;        // points into the mapped file
  size_t file_index = 0;  // which shard (index into TensorArchive::files())
};

class TensorArchive {
 public:
  // nullptr when absent.
  const TensorEntry* find(std::string_view name) const;
  // Throws "tensor NAME missing from CHECKPOINT" when absent.
  const TensorEntry& get(std::string_view name) const;
  // Sorted by name. Two entries may view the same bytes (tied weights of a torch checkpoint).
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::vector<MappedFile>& files() const { return files_; }
  // Sum of tensor bytes (bytes viewed by two names are counted twice).
  size_t total_bytes() const;
  // Free-form string map (safetensors "__metadata__" of the first file; empty for torch files).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // What was opened: the checkpoint file, or the index.json of a sharded checkpoint.
  const std::filesystem::path& source() const { return source_; }

 protected:
  // For the format readers. Sorts tensors_ by name; throws naming both files when a name repeats.
  void sort_and_check_unique();
  // A sharded checkpoint: reads the "weight_map" of `index` (tensor name -> shard file name in
  // the index's directory), maps every shard once in name order, calls add_shard(i) for each
  // (it appends files()[i]'s tensors to tensors_), then checks every listed tensor is in its
  // shard. Throws naming the index and the shard or tensor at fault.
  void open_sharded(const std::filesystem::path& index, const std::function<void(size_t)>& add_shard);
  // One checkpoint file: maps it, calls add_file(0), then sorts and checks the names.
  void open_single(const std::filesystem::path& file, const std::function<void(size_t)>& add_file);
  // A model directory's checkpoint, in transformers' order: the single `file_name` through
  // open_single when it exists (an index beside it is not read), else `index_name` through
  // open_sharded. Throws naming the directory when neither exists.
  void open_in_dir(const std::filesystem::path& dir, const std::string& file_name, const std::string& index_name,
                   const std::function<void(size_t)>& add_file);
  // Maps `p` after refusing anything but a regular file (opening a FIFO blocks).
  static MappedFile map_checkpoint_file(const std::filesystem::path& p);
  // Throws naming `f` when it is one of the text files a failed download leaves in a checkpoint's
  // place (a Git LFS pointer, a web page, a JSON error), which would otherwise read as a damaged
  // checkpoint of absurd sizes. map_checkpoint_file calls it.
  static void refuse_download_leftovers(const MappedFile& f);

  std::filesystem::path source_;
  std::vector<MappedFile> files_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace flexh2o
