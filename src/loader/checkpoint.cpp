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
  std::string broken;  // the first name there but not resolvable, said when no later one exists
  for (const auto& [name, format] : order) {
    const std::filesystem::path p = dir / name;
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) return format;
    // A Hugging Face cache whose blob is gone, a moved directory, a loop.
    if (std::error_code lec; broken.empty() && std::filesystem::is_symlink(std::filesystem::symlink_status(p, lec)))
      broken = detail::concat(p.string(), " is a symbolic link to ", std::filesystem::read_symlink(p, lec).string(),
                              ", which cannot be opened (", ec ? ec.message() : std::string("it does not exist"),
                              "): the file it stood for is gone (a Hugging Face cache whose blob was removed, or "
                              "a moved directory); download the model again");
  }
  if (!broken.empty()) FH_FAIL(broken);
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
