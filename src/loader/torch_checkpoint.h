// PyTorch checkpoints read without running any code: pytorch_model.bin (torch.save's zip
// format, torch >= 1.6) or shards listed by pytorch_model.bin.index.json. The zip directory,
// the restricted pickle (torch_pickle.h) and every tensor's storage, offset and extent are
// validated; contiguous tensors become views into the memory-mapped file, exactly like
// safetensors ones (tied weights share bytes). Anything torch.load would need code for is
// refused with an error naming the file. The result is the shared tensor directory.
#pragma once

#include <filesystem>

#include "loader/archive.h"

namespace flexh2o {

class TorchArchive : public TensorArchive {
 public:
  // dir/pytorch_model.bin if present, else dir/pytorch_model.bin.index.json (sharded).
  static TorchArchive open_dir(const std::filesystem::path& dir);
  // One file written by torch.save(state_dict, f) with the zip format. Throws flexh2o::Error
  // naming the file for: the legacy (pre-1.6) format, a compressed or encrypted entry, a
  // big-endian checkpoint, a pickle that calls anything but torch's tensor rebuilders, a
  // dtype other than F32/F16/BF16/I32/I64/U8, a non-contiguous tensor, a tensor reaching past
  // its storage, a storage whose record size disagrees with its element count, or data not
  // aligned to its element size. The storages' CRC-32s are not checked (that would read every
  // byte of the checkpoint at load); data.pkl's is.
  static TorchArchive open_file(const std::filesystem::path& file);
};

}  // namespace flexh2o
