// Parsing Hugging Face config.json into ModelConfig, with errors that name file and key.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o {
namespace {

using nlohmann::json;

// Upper bounds far above any published model (LLaMA-3 405B: hidden 16384, 126 layers, 128
// heads), chosen so that every product the engine forms from them (vocab x hidden, layers x
// kv_dim x bytes, ...) fits in int64 and every layer or token index fits in int32.
constexpr int64_t kMaxDim = int64_t(1) << 20;      // hidden, ffn, head_dim
constexpr int64_t kMaxCount = int64_t(1) << 16;    // layers, heads
constexpr int64_t kMaxIndex = INT32_MAX;           // vocabulary size, positions, token ids

class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  // A required integer in [1, hi].
  int64_t positive_int(const char* key, int64_t hi) const {
    if (!has(key)) FH_FAIL(source_, ": required key \"", key, "\" is missing");
    return json_to_int(j_[key], 1, hi, name(key));
  }
  int64_t positive_int_or(const char* key, int64_t hi, int64_t dflt) const {
    return has(key) ? positive_int(key, hi) : dflt;
  }
  double number_or(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_[key];
    // float(x) of a double beyond float's range is undefined: refuse it here.
    if (!v.is_number() || !(std::fabs(v.get<double>()) <= double(std::numeric_limits<float>::max())))
      FH_FAIL(source_, ": \"", key, "\" must be a finite number, got ", json_excerpt(v));
    return v.get<double>();
  }
  bool bool_or(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!j_[key].is_boolean()) FH_FAIL(source_, ": \"", key, "\" must be true or false, got ", json_excerpt(j_[key]));
    return j_[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j_[key].is_string()) FH_FAIL(source_, ": \"", key, "\" must be a string, got ", json_excerpt(j_[key]));
    return j_[key].get<std::string>();
  }
  std::optional<int32_t> token_id(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_[key];
    if (v.is_array()) {  // LLaMA-3 lists several eos ids: take the first
      if (v.empty()) FH_FAIL(source_, ": \"", key, "\" is an empty list, not a token id");
      return int32_t(json_to_int(v[0], 0, kMaxIndex, name(key)));
    }
    return int32_t(json_to_int(v, 0, kMaxIndex, name(key)));
  }
  const std::string& source() const { return source_; }

 private:
  std::string name(const char* key) const { return source_ + ": \"" + key + "\""; }

  const json& j_;
  std::string source_;
};

void parse_opt(const Reader& r, ModelConfig& c) {
  c.arch = Arch::kOpt;
  c.ffn_dim = r.positive_int("ffn_dim", kMaxDim);
  c.n_kv_heads = c.n_heads;
  c.norm_eps = 1e-5f;
  c.tie_embeddings = r.bool_or("tie_word_embeddings", true);
  c.attention_bias = c.o_bias = c.mlp_bias = r.bool_or("enable_bias", true);
  if (!c.attention_bias)
    FH_FAIL(r.source(), ": OPT without biases (enable_bias=false) is not supported");
  if (!r.bool_or("do_layer_norm_before", true))
    FH_FAIL(r.source(), ": post-LN OPT (do_layer_norm_before=false, e.g. OPT-350M) is not supported");
  if (r.positive_int_or("word_embed_proj_dim", kMaxDim, c.hidden) != c.hidden)
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
  c.ffn_dim = r.positive_int("intermediate_size", kMaxDim);
  c.n_kv_heads = r.positive_int_or("num_key_value_heads", kMaxCount, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    FH_FAIL(r.source(), ": num_attention_heads (", c.n_heads, ") is not a multiple of num_key_value_heads (",
            c.n_kv_heads, ")");
  c.norm_eps = float(r.number_or("rms_norm_eps", 1e-6));
  c.rope_theta = float(r.number_or("rope_theta", 10000.0));
  c.tie_embeddings = r.bool_or("tie_word_embeddings", false);
  if (c.model_type == "qwen2") {  // Qwen2Attention: q/k/v with bias, o_proj without
    c.attention_bias = true;
  } else {
    c.attention_bias = c.o_bias = r.bool_or("attention_bias", false);
    c.mlp_bias = r.bool_or("mlp_bias", false);
  }
  std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu")
    FH_FAIL(r.source(), ": hidden_act \"", act, "\" is not supported (", c.model_type, " uses silu)");
  if (r.has("rope_scaling"))
    FH_FAIL(r.source(), ": rope_scaling ", json_excerpt(j["rope_scaling"]), " is not supported");
  // transformers 5 writes the rotary settings as rope_parameters {rope_type, rope_theta, ...}.
  if (r.has("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    if (!rp.is_object()) FH_FAIL(r.source(), ": \"rope_parameters\" must be an object, got ", json_excerpt(rp));
    const Reader p(rp, r.source() + " rope_parameters");
    const std::string type = p.string_or("rope_type", "default");
    if (type != "default")
      FH_FAIL(r.source(), ": rope_parameters ", json_excerpt(rp), " is not supported (rope_type \"", type,
              "\"; only \"default\" is)");
    c.rope_theta = float(p.number_or("rope_theta", c.rope_theta));
  }
  // Mistral: sliding_window (null: none); Qwen2: only with use_sliding_window.
  const bool windowed =
      c.model_type == "mistral" || (c.model_type == "qwen2" && r.bool_or("use_sliding_window", false));
  if (windowed && r.has("sliding_window")) {
    c.sliding_window = r.positive_int("sliding_window", kMaxIndex);
    c.max_positions = std::min(c.max_positions, c.sliding_window);
  }
}

}  // namespace

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  const json j = parse_json(text, source);
  if (!j.is_object()) FH_FAIL(source, ": expected a JSON object");
  Reader r(j, source);
  ModelConfig c;
  c.model_type = r.string_or("model_type", "");
  if (c.model_type.empty()) FH_FAIL(source, ": required key \"model_type\" is missing");
  c.name = r.string_or("_name_or_path", "");
  c.vocab_size = r.positive_int("vocab_size", kMaxIndex);
  c.hidden = r.positive_int("hidden_size", kMaxDim);
  c.n_layers = r.positive_int("num_hidden_layers", kMaxCount);
  c.n_heads = r.positive_int("num_attention_heads", kMaxCount);
  c.max_positions = r.positive_int("max_position_embeddings", kMaxIndex - 2);  // OPT stores 2 more
  if (c.model_type == "opt") {
    parse_opt(r, c);
  } else if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2") {
    parse_llama(r, j, c);
  } else {
    FH_FAIL(source, ": unknown model_type \"", c.model_type, "\" (supported: opt, llama, mistral, qwen2)");
  }
  c.head_dim = r.positive_int_or("head_dim", kMaxDim, c.hidden / c.n_heads);
  if (!r.has("head_dim") && c.hidden % c.n_heads != 0)
    FH_FAIL(source, ": hidden_size (", c.hidden, ") is not a multiple of num_attention_heads (", c.n_heads, ")");
  c.bos_id = r.token_id("bos_token_id");
  c.eos_id = r.token_id("eos_token_id");
  c.pad_id = r.token_id("pad_token_id");
  std::string dt = r.string_or("torch_dtype", r.string_or("dtype", "float16"));  // "dtype": transformers 5
  if (dt == "float32") c.dtype = DType::F32;
  else if (dt == "bfloat16") c.dtype = DType::BF16;
  else c.dtype = DType::F16;
  return c;
}

ModelConfig ModelConfig::from_file(const std::filesystem::path& path) {
  ModelConfig c = from_json_text(read_input_file(path, "model config"), path.string());
  if (c.name.empty()) c.name = path.parent_path().filename().string();
  return c;
}

}  // namespace flexh2o
