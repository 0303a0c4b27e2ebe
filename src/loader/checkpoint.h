// Which checkpoint a model directory holds, and opening it as the shared tensor directory.
// Safetensors is preferred when a directory holds both formats (Hugging Face repositories often
// publish both): it is read with no pickle at all. Thread-safe; blocking (maps files).
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

#include "loader/archive.h"

namespace flexh2o {

enum class CheckpointFormat { kSafetensors, kSafetensorsSharded, kTorch, kTorchSharded };

// The first of model.safetensors, model.safetensors.index.json, pytorch_model.bin,
// pytorch_model.bin.index.json that exists in `dir` (transformers' order); nullopt when none
// does. Throws naming it when none exists and one is a symbolic link that does not resolve.
std::optional<CheckpointFormat> detect_checkpoint(const std::filesystem::path& dir);
// detect_checkpoint(), throwing flexh2o::Error naming `dir` and all four names when none exists.
CheckpointFormat find_checkpoint(const std::filesystem::path& dir);

// "safetensors", "safetensors (sharded)", "pytorch", "pytorch (sharded)".
std::string_view checkpoint_format_name(CheckpointFormat f);

// Opens the checkpoint find_checkpoint() picks (SafetensorsArchive or TorchArchive).
TensorArchive open_checkpoint_dir(const std::filesystem::path& dir);

}  // namespace flexh2o
