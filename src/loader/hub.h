// Resolving a model argument: a local directory, or a Hugging Face hub id ("facebook/opt-1.3b")
// looked up in the local HF cache layout without any download.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace flexh2o {

// What the caller (main) read from the environment; library code never calls getenv.
struct HubEnv {
  std::optional<std::filesystem::path> hf_hub_cache;  // $HF_HUB_CACHE
  std::optional<std::filesystem::path> hf_home;       // $HF_HOME (cache in $HF_HOME/hub)
  std::optional<std::filesystem::path> home;          // $HOME (~/.cache/huggingface/hub)
};

// If `spec` names an existing directory, returns it. Else, if it looks like ORG/NAME (or
// ORG/NAME@REVISION), returns CACHE/models--ORG--NAME/snapshots/REV where REV is the revision
// given, else the one refs/main points to, else the only snapshot. Throws flexh2o::Error that
// says where it looked and how to fetch the model (huggingface-cli download ORG/NAME) when absent.
std::filesystem::path resolve_model_dir(const std::string& spec, const HubEnv& env);

}  // namespace flexh2o
