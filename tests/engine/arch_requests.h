// Requests for the transformers-written test checkpoints of tests/data/arch (no tokenizer there):
// the prompts of their reference/logits.json, cut where needed to leave room for `gen` new tokens
// within the model's positions, greedy.
#pragma once

#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/test_util.h"
#include "model/config.h"

namespace flexh2o::test {

// The arch models every device runs: each rope type, fused projections, q/k norms, partial rotary,
// mixtures of experts, Phi-3-mini's head_dim 96, Gemma's GeGLU, soft caps and per-layer ropes,
// sliding windows (all layers, or some) that the longer prompts pass.
inline const std::vector<const char*>& arch_models() {
  static const std::vector<const char*> names = {"arch/mistral",        "arch/qwen2",       "arch/qwen3",
                                                 "arch/llama_llama3",   "arch/qwen2_yarn",  "arch/mistral_linear",
                                                 "arch/llama_longrope", "arch/phi3",        "arch/phi3_longrope",
                                                 "arch/phi3_partial",   "arch/mixtral",     "arch/qwen3_moe",
                                                 "arch/qwen2_moe",      "arch/phi3_hd96",   "arch/olmoe",
                                                 "arch/gemma",          "arch/gemma2",      "arch/gemma3_text_linear",
                                                 "arch/gemma3_text_mm", "arch/qwen2_window"};
  return names;
}

inline std::vector<GenerationRequest> arch_requests(const std::string& model, const ModelConfig& c, int64_t gen) {
  const nlohmann::json ref = read_json(model_dir(model) / "reference" / "logits.json");
  std::vector<GenerationRequest> reqs;
  for (const auto& p : ref["prompts"]) {
    GenerationRequest r;
    r.prompt_ids = p["ids"].get<std::vector<int32_t>>();
    if (int64_t(r.prompt_ids.size()) + gen > c.max_positions) r.prompt_ids.resize(size_t(c.max_positions - gen));
    r.max_new_tokens = gen;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  return reqs;
}

}  // namespace flexh2o::test
