// Parsing Hugging Face config.json into ModelConfig, with errors that name file and key.
#include "model/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace flexh2o {
namespace {

using nlohmann::json;

class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t positive_int(const char* key) const {
    if (!has(key)) FH_FAIL(source_, ": required key \"", key, "\" is missing");
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      FH_FAIL(source_, ": \"", key, "\" must be a positive integer, got ", v.dump());
    return v.get<int64_t>();
  }
  int64_t positive_int_or(const char* key, int64_t dflt) const {
    return has(key) ? positive_int(key) : dflt;
  }
  double number_or(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    if (!j_[key].is_number()) FH_FAIL(source_, ": \"", key, "\" must be a number, got ", j_[key].dump());
    return j_[key].get<double>();
  }
  bool bool_or(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!j_[key].is_boolean()) FH_FAIL(source_, ": \"", key, "\" must be true or false, got ", j_[key].dump());
    return j_[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j_[key].is_string()) FH_FAIL(source_, ": \"", key, "\" must be a string, got ", j_[key].dump());
    return j_[key].get<std::string>();
  }
  std::optional<int32_t> token_id(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_[key];
    if (v.is_array()) {  // LLaMA-3 lists several eos ids: take the first
      if (v.empty() || !v[0].is_number_integer()) FH_FAIL(source_, ": \"", key, "\" is not a token id");
      return v[0].get<int32_t>();
    }
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      FH_FAIL(source_, ": \"", key, "\" must be a token id, got ", v.dump());
    return v.get<int32_t>();
  }
  const std::string& source() const { return source_; }

 private:
  const json& j_;
  std::string source_;
};

void parse_opt(const Reader& r, ModelConfig& c) {
  c.arch = Arch::kOpt;
  c.ffn_dim = r.positive_int("ffn_dim");
  c.n_kv_heads = c.n_heads;
  c.norm_eps = 1e-5f;
  c.tie_embeddings = r.bool_or("tie_word_embeddings", true);
  c.attention_bias = c.mlp_bias = r.bool_or("enable_bias", true);
  if (!c.attention_bias)
    FH_FAIL(r.source(), ": OPT without biases (enable_bias=false) is not supported");
  if (!r.bool_or("do_layer_norm_before", true))
    FH_FAIL(r.source(), ": post-LN OPT (do_layer_norm_before=false, e.g. OPT-350M) is not supported");
  if (r.positive_int_or("word_embed_proj_dim", c.hidden) != c.hidden)
    FH_FAIL(r.source(), ": word_embed_proj_dim != hidden_size (OPT-350M projection) is not supported");
  if (r.bool_or("_remove_final_layer_norm", false))
    FH_FAIL(r.source(), ": _remove_final_layer_norm=true is not supported");
  if (!r.bool_or("layer_norm_elementwise_affine", true))
    FH_FAIL(r.source(), ": layer_norm_elementwise_affine=false is not supported");
  std::string act = r.string_or("activation_function", "relu");
  if (act != "relu") FH_FAIL(r.source(), ": activation_function \"", act, "\" is not supported (OPT uses relu)");
}

void parse_llama(const Reader& r, const json& j, ModelConfig& c) {
  c.arch = Arch::kLlama;
  c.ffn_dim = r.positive_int("intermediate_size");
  c.n_kv_heads = r.positive_int_or("num_key_value_heads", c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    FH_FAIL(r.source(), ": num_attention_heads (", c.n_heads, ") is not a multiple of num_key_value_heads (",
            c.n_kv_heads, ")");
  c.norm_eps = float(r.number_or("rms_norm_eps", 1e-6));
  c.rope_theta = float(r.number_or("rope_theta", 10000.0));
  c.tie_embeddings = r.bool_or("tie_word_embeddings", false);
  c.attention_bias = r.bool_or("attention_bias", false);
  c.mlp_bias = r.bool_or("mlp_bias", false);
  std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu") FH_FAIL(r.source(), ": hidden_act \"", act, "\" is not supported (LLaMA uses silu)");
  if (r.has("rope_scaling"))
    FH_FAIL(r.source(), ": rope_scaling ", j["rope_scaling"].dump(), " is not supported yet");
}

}  // namespace

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    FH_FAIL(source, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) FH_FAIL(source, ": expected a JSON object");
  Reader r(j, source);
  ModelConfig c;
  c.model_type = r.string_or("model_type", "");
  if (c.model_type.empty()) FH_FAIL(source, ": required key \"model_type\" is missing");
  c.name = r.string_or("_name_or_path", "");
  c.vocab_size = r.positive_int("vocab_size");
  c.hidden = r.positive_int("hidden_size");
  c.n_layers = r.positive_int("num_hidden_layers");
  c.n_heads = r.positive_int("num_attention_heads");
  c.max_positions = r.positive_int("max_position_embeddings");
  if (c.model_type == "opt") {
    parse_opt(r, c);
  } else if (c.model_type == "llama") {
    parse_llama(r, j, c);
  } else {
    FH_FAIL(source, ": unknown model_type \"", c.model_type, "\" (supported: opt, llama)");
  }
  c.head_dim = r.positive_int_or("head_dim", c.hidden / c.n_heads);
  if (!r.has("head_dim") && c.hidden % c.n_heads != 0)
    FH_FAIL(source, ": hidden_size (", c.hidden, ") is not a multiple of num_attention_heads (", c.n_heads, ")");
  c.bos_id = r.token_id("bos_token_id");
  c.eos_id = r.token_id("eos_token_id");
  c.pad_id = r.token_id("pad_token_id");
  std::string dt = r.string_or("torch_dtype", "float16");
  if (dt == "float32") c.dtype = DType::F32;
  else if (dt == "bfloat16") c.dtype = DType::BF16;
  else c.dtype = DType::F16;
  return c;
}

ModelConfig ModelConfig::from_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) FH_FAIL("cannot read model config ", path.string(), ": file missing or unreadable");
  std::stringstream ss;
  ss << in.rdbuf();
  ModelConfig c = from_json_text(ss.str(), path.string());
  if (c.name.empty()) c.name = path.parent_path().filename().string();
  return c;
}

}  // namespace flexh2o
