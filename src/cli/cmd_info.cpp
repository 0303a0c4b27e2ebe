// `flexh2o info MODEL`: config, checkpoint format, parameter count, bytes per tensor group, KV bytes per token.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "cli/commands.h"
#include "engine/kv_evict.h"
#include "engine/memory_plan.h"
#include "loader/checkpoint.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o::cli {
using nlohmann::json;

void register_info(CLI::App& app, InfoArgs& a) {
  auto* i = app.add_subcommand("info", "Describe a model: config, parameters, bytes per tensor group, KV bytes/token; with a "
                               "checkpoint, whether it loads (exit 1 if not) and the tensors its config does not read");
  i->add_option("model,-m,--model", a.model, "Model directory, hub id (ORG/NAME) or preset name (as a positional or -m, like the other commands)")->required();
  i->add_flag("--json", a.json, "Print one JSON object");
}

namespace {
std::string group_of(const std::string& name) {
  if (name.find("embed_") != std::string::npos) return "embeddings";
  if (name.find("lm_head") != std::string::npos) return "lm_head";
  if (name.find("norm") != std::string::npos) return "norms";
  if (name.find("self_attn.") != std::string::npos) return "attention";
  return "mlp";
}

// A cap as the config wrote it: 50, or 30.5 (not truncated to an integer).
std::string short_number(float x) {
  std::ostringstream o;
  o << std::setprecision(6) << x;
  return o.str();
}

// "rope  llama3, theta 500000, factor 8 over 8192 pretraining positions\n"; empty for OPT.
std::string rope_line(const ModelConfig& c) {
  if (c.arch != Arch::kLlama) return {};
  std::ostringstream o;
  o << "rope         " << c.rope.type << ", theta " << c.rope.theta;
  if (c.rope.type != "default") o << ", factor " << c.rope.factor;
  if (c.rope.original_max_positions) o << " over " << c.rope.original_max_positions << " pretraining positions";
  if (c.rope.attention_factor != 1) o << ", attention factor " << std::setprecision(4) << c.rope.attention_factor;
  if (c.rope.type == "dynamic") o << " (within max_position_embeddings it is the default rope)";
  if (c.rope.type == "longrope") o << " (its short factors; beyond, transformers switches)";
  if (c.has_local_rope) o << "; sliding-window layers: " << c.rope_local.type << ", theta " << c.rope_local.theta;
  o << "\n";
  return o.str();
}

}  // namespace

int run_info(const InfoArgs& a, const Env& env) {
  std::string source;
  ModelConfig c = resolve_config(env, a.model, &source);
  const size_t esize = dtype_size(c.dtype);
  std::map<std::string, int64_t> group_bytes;
  int64_t params = 0;
  for (const WeightSpec& s : weight_specs(c)) {
    params += s.shape.numel();
    group_bytes[group_of(s.name)] += s.shape.numel() * int64_t(esize);
  }
  const int64_t kv_q4 = c.kv_bytes_per_token(DType::Q4);
  json j{{"name", c.name},
         {"source", source},
         {"model_type", c.model_type},
         {"vocab_size", c.vocab_size},
         {"hidden_size", c.hidden},
         {"num_layers", c.n_layers},
         {"num_heads", c.n_heads},
         {"num_kv_heads", c.n_kv_heads},
         {"head_dim", c.head_dim},
         {"ffn_dim", c.ffn_dim},
         {"max_position_embeddings", c.max_positions},
         {"sliding_window", c.sliding_window},
         {"tie_word_embeddings", c.tie_embeddings},
         {"dtype", dtype_name(c.dtype)},
         {"parameters", params},
         {"weight_bytes", params * int64_t(esize)},
         {"bytes_per_group", group_bytes},
         {"kv_bytes_per_token_f16", c.kv_bytes_per_token(DType::F16)},
         {"kv_bytes_per_token_f32", c.kv_bytes_per_token(DType::F32)},
         {"kv_bytes_per_token_q4", kv_q4}};
  if (c.arch == Arch::kLlama)
    j["rope"] = {{"type", c.rope.type},
                 {"theta", c.rope.theta},
                 {"factor", c.rope.factor},
                 {"original_max_position_embeddings", c.rope.original_max_positions},
                 {"attention_factor", c.rope.attention_factor}};
  // A MoE's parameters a token uses: all but its unchosen experts.
  const int64_t active = params - c.n_layers * (c.n_experts - c.experts_per_token) * 3 * c.hidden * c.ffn_dim;
  if (c.moe())
    j["experts"] = {{"count", c.n_experts},
                    {"per_token", c.experts_per_token},
                    {"norm_topk_prob", c.norm_topk_prob},
                    {"shared_expert_dim", c.shared_expert_dim},
                    {"active_parameters", active}};
  if (c.gelu_gate)  // Gemma
    j["gemma"] = {{"sandwich_norms", c.sandwich_norms},
                  {"embed_scale", c.embed_scale},
                  {"attention_scale", c.attention_scale()},
                  {"attn_logit_softcapping", c.attn_softcap},
                  {"final_logit_softcapping", c.final_softcap},
                  {"sliding_layers", std::count(c.sliding_layers.begin(), c.sliding_layers.end(), 1)}};
  // Which weights a load would read (presets have none; a directory may hold config.json only).
  std::string checkpoint = "none";
  // The checkpoint as a load reads it (mapped, nothing copied): a truncated or mismatched one is
  // said here, and tensors the config does not read are named.
  std::string load_error;
  std::vector<std::string> unused;
  try {
    if (std::filesystem::is_directory(source))
      if (const auto f = detect_checkpoint(source)) checkpoint = std::string(checkpoint_format_name(*f));
  } catch (const Error& e) {  // a name there that does not resolve
    checkpoint = "cannot be opened";
    load_error = e.what();
    j["checkpoint_error"] = load_error;
  }
  j["checkpoint"] = checkpoint;
  if (checkpoint != "none" && load_error.empty()) {
    try {
      unused = Model::load_dir(source).unused_tensors();
      j["unused_tensors"] = unused;
    } catch (const Error& e) {
      load_error = e.what();
      j["checkpoint_error"] = load_error;
    }
  }
  // The directory's tokenizer as a run loads it: a damaged one fails every run that does not
  // give another with --tokenizer.
  std::string tokenizer = "none", tokenizer_error;
  if (std::filesystem::is_directory(source)) {
    try {
      if (const std::optional<Tokenizer> t = Tokenizer::load_if_present(source))
        tokenizer = std::to_string(t->vocab_size()) + " tokens";
    } catch (const Error& e) {
      tokenizer = "cannot be loaded";
      tokenizer_error = e.what();
      j["tokenizer_error"] = tokenizer_error;
    }
  }
  j["tokenizer"] = tokenizer;
  const int code = load_error.empty() && tokenizer_error.empty() ? 0 : 1;
  const auto say_errors = [&] {
    if (!load_error.empty()) write_stderr("flexh2o: error: the checkpoint cannot be loaded: " + load_error + "\n");
    if (!tokenizer_error.empty())
      write_stderr("flexh2o: error: the tokenizer cannot be loaded: " + tokenizer_error + "\n");
  };
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    say_errors();
    return code;
  }
  std::cout << "model        " << c.name << " (" << c.model_type << ", " << source << ")\n"
            << "checkpoint   " << checkpoint << "\n"
            << "tokenizer    " << tokenizer << "\n"
            << "shape        " << c.n_layers << " layers, hidden " << c.hidden << ", " << c.n_heads << " heads ("
            << c.n_kv_heads << " kv) x " << c.head_dim << ", ffn " << c.ffn_dim << ", vocab " << c.vocab_size << ", "
            << c.max_positions << " positions\n";
  if (c.sliding_window)
    std::cout << "window       " << std::count(c.sliding_layers.begin(), c.sliding_layers.end(), 1) << " of "
              << c.n_layers << " layers attend to the last " << c.sliding_window << " positions only"
              << (window_caps_full_cache(c, c.max_positions)       ? " (a full cache keeps that many a sequence)"
                  : full_cache_window(c, false, c.max_positions) ? " (a full cache keeps that many in those layers)"
                                                                 : "")
              << "\n";
  if (c.moe())
    std::cout << "experts      " << c.n_experts << " of ffn " << c.ffn_dim << ", " << c.experts_per_token << " a token"
              << (c.norm_topk_prob ? " (weights renormalized)" : "")
              << (c.shared_expert_dim ? ", a gated shared expert of " + std::to_string(c.shared_expert_dim) : "")
              << ", " << std::setprecision(4) << active / 1e9 << " B parameters active a token\n";
  if (c.gelu_gate)
    std::cout << "gemma        GeGLU, norms by 1 + weight"
              << (c.sandwich_norms ? " (also after attention and MLP)" : "") << ", embeddings x " << c.embed_scale
              << ", softmax scale " << c.attention_scale()
              << (c.attn_softcap > 0 ? ", scores capped at " + short_number(c.attn_softcap) : "")
              << (c.final_softcap > 0 ? ", logits capped at " + short_number(c.final_softcap) : "") << "\n";
  std::cout << rope_line(c) << "parameters   " << params << " (" << std::setprecision(4) << params / 1e9 << " B)\n"
            << "weights      " << human_bytes(uint64_t(params) * esize) << " in " << dtype_name(c.dtype) << "\n";
  for (const auto& [g, b] : group_bytes)
    std::cout << "  " << std::left << std::setw(11) << g << human_bytes(uint64_t(b)) << "\n";
  std::cout << "KV per token " << human_bytes(uint64_t(c.kv_bytes_per_token(DType::F16))) << " (f16, bf16), "
            << human_bytes(uint64_t(c.kv_bytes_per_token(DType::F32))) << " (f32), " << human_bytes(uint64_t(kv_q4))
            << " (q4)\n";
  if (!unused.empty()) {
    std::cout << "not read     " << unused.size() << " tensor(s) of the checkpoint:";
    for (const std::string& n : unused) std::cout << " " << n;
    std::cout << "\n";
  }
  say_errors();
  return code;
}

}  // namespace flexh2o::cli
