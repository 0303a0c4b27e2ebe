// find_checkpoint / open_checkpoint_dir: the preference order between the formats.
#include "loader/checkpoint.h"

#include "core/error.h"
#include "loader/safetensors.h"
#include "loader/torch_checkpoint.h"

namespace flexh2o {

std::optional<CheckpointFormat> detect_checkpoint(const std::filesystem::path& dir) {
  // transformers' order: a whole file before an index beside it (a folder re-downloaded in
  // another layout holds both, and transformers reads the whole file).
  const std::pair<const char*, CheckpointFormat> order[] = {
      {"model.safetensors", CheckpointFormat::kSafetensors},
      {"model.safetensors.index.json", CheckpointFormat::kSafetensorsSharded},
      {"pytorch_model.bin", CheckpointFormat::kTorch},
      {"pytorch_model.bin.index.json", CheckpointFormat::kTorchSharded},
  };
  std::error_code ec;
  for (const auto& [name, format] : order)
    if (std::filesystem::exists(dir / name, ec)) return format;
  return std::nullopt;
}

CheckpointFormat find_checkpoint(const std::filesystem::path& dir) {
  if (const auto f = detect_checkpoint(dir)) return *f;
  FH_FAIL("no checkpoint in ", dir.string(), ": none of model.safetensors, model.safetensors.index.json, "
          "pytorch_model.bin, pytorch_model.bin.index.json exists.");
}

std::string_view checkpoint_format_name(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::kSafetensors: return "safetensors";
    case CheckpointFormat::kSafetensorsSharded: return "safetensors (sharded)";
    case CheckpointFormat::kTorch: return "pytorch";
    case CheckpointFormat::kTorchSharded: return "pytorch (sharded)";
  }
  return "unknown";
}

TensorArchive open_checkpoint_dir(const std::filesystem::path& dir) {
  switch (find_checkpoint(dir)) {
    case CheckpointFormat::kSafetensors:
    case CheckpointFormat::kSafetensorsSharded: return SafetensorsArchive::open_dir(dir);
    case CheckpointFormat::kTorch:
    case CheckpointFormat::kTorchSharded: return TorchArchive::open_dir(dir);
  }
  FH_FAIL("unreachable checkpoint format");
}

}  // namespace flexh2o
