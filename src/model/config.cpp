// Parsing Hugging Face config.json into ModelConfig, with errors that name file and key.
#include "model/config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_guard.h"
#include "model/detail/config_reader.h"
#include "model/detail/rope_parse.h"

namespace flexh2o {
namespace {

using nlohmann::json;
using model_detail::kMaxCount;
using model_detail::kMaxDim;
using model_detail::kMaxIndex;
using model_detail::Reader;

// A quantized checkpoint's tensors are packed (GPTQ/AWQ qweight and scales, bitsandbytes, FP8)
// for its quantizer to unpack; read as plain weights they would be missing or wrong.
void refuse_quantized(const json& j, const std::string& source) {
  if (!j.contains("quantization_config") || !j["quantization_config"].is_object()) return;
  const json& q = j["quantization_config"];
  const json method = q.contains("quant_method") ? q["quant_method"] : json("unnamed");
  FH_FAIL(source, ": a quantized checkpoint (quantization_config.quant_method ", json_excerpt(method),
          "): flexh2o reads f16, bf16 and f32 weights and quantizes them itself (--compress-weight: 4-bit "
          "groups, as FlexGen). Use the model's unquantized checkpoint");
}

// The model types the LLaMA path runs: dense ones, and mixtures of experts (parse_moe).
constexpr std::array<std::string_view, 5> kDenseLlamaTypes = {"llama", "mistral", "qwen2", "qwen3", "phi3"};
constexpr std::array<std::string_view, 4> kMoeTypes = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};
constexpr std::array<std::string_view, 3> kGemmaTypes = {"gemma", "gemma2", "gemma3_text"};
template <size_t N>
bool is_one_of(const std::string& t, const std::array<std::string_view, N>& list) {
  return std::find(list.begin(), list.end(), t) != list.end();
}

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

// MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig and OlmoeConfig, with their defaults. The Qwen ones may keep
// some layers dense (mlp_only_layers, decoder_sparse_step); the published checkpoints do not,
// and a mix is refused.
void parse_moe(const Reader& r, ModelConfig& c) {
  const bool qwen2 = c.model_type == "qwen2_moe", qwen = qwen2 || c.model_type == "qwen3_moe";
  const bool olmoe = c.model_type == "olmoe";
  c.mlp_bias = false;  // no family's experts have biases (MixtralConfig has no mlp_bias)
  const char* experts_key = (qwen || olmoe) && !r.has("num_local_experts") ? "num_experts" : "num_local_experts";
  // The bounds of the CUDA routing kernel (kernels/cuda/ops.h: moe_route), far above published models'.
  c.n_experts = r.positive_int_or(experts_key, 1024, qwen2 ? 60 : qwen ? 128 : olmoe ? 64 : 8);
  c.experts_per_token = r.positive_int_or("num_experts_per_tok", 64, qwen2 ? 4 : qwen || olmoe ? 8 : 2);
  if (c.experts_per_token > c.n_experts)
    FH_FAIL(r.source(), ": num_experts_per_tok (", c.experts_per_token, ") exceeds the ", c.n_experts, " experts");
  if (olmoe) {  // intermediate_size is an expert's
    c.norm_topk_prob = r.bool_or("norm_topk_prob", false);
    return;
  }
  if (!qwen) return;  // Mixtral always renormalizes the chosen experts' weights
  c.ffn_dim = r.positive_int_or("moe_intermediate_size", kMaxDim, qwen2 ? 1408 : 768);
  if (qwen2) c.shared_expert_dim = r.positive_int_or("shared_expert_intermediate_size", kMaxDim, 5632);
  c.norm_topk_prob = r.bool_or("norm_topk_prob", false);
  if (r.positive_int_or("decoder_sparse_step", kMaxCount, 1) != 1)
    FH_FAIL(r.source(), ": decoder_sparse_step other than 1 (dense layers between the MoE ones) is not supported");
  const nlohmann::json& j = r.object();
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null() &&
      !(j["mlp_only_layers"].is_array() && j["mlp_only_layers"].empty()))
    FH_FAIL(r.source(), ": mlp_only_layers (dense layers among the MoE ones) is not supported, got ",
            json_excerpt(j["mlp_only_layers"]));
}

// A Gemma 2 soft cap: `dflt` when the key is absent, none when it is null, else a positive number.
float softcap(const Reader& r, const char* key, double dflt) {
  if (!r.object().contains(key)) return float(dflt);
  if (!r.has(key)) return 0.f;
  const double v = r.number_or(key, 0);
  if (!(v > 0)) FH_FAIL(r.source(), ": \"", key, "\" must be positive or null, got ", v);
  return float(v);
}

// The sliding-window layers (ModelConfig::sliding_layers) and their window: layer_types where the
// config lists it, else `fallback(layer)`; the window is sliding_window (4096 when absent, as in
// transformers' configs). Leaves both empty when no layer slides.
template <class F>
void read_sliding_layers(const Reader& r, ModelConfig& c, F&& fallback) {
  c.sliding_layers.assign(size_t(c.n_layers), 0);
  if (r.has("layer_types")) {
    const json& t = r.object()["layer_types"];
    if (!t.is_array() || int64_t(t.size()) != c.n_layers)
      FH_FAIL(r.source(), ": \"layer_types\" must list the ", c.n_layers, " layers, got ", json_excerpt(t));
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] == "sliding_attention")
        c.sliding_layers[i] = 1;
      else if (t[i] != "full_attention")
        FH_FAIL(r.source(), ": \"layer_types\" entry ", i, " must be \"sliding_attention\" or \"full_attention\", got ",
                json_excerpt(t[i]));
    }
  } else {
    for (int64_t i = 0; i < c.n_layers; ++i) c.sliding_layers[size_t(i)] = fallback(i) ? 1 : 0;
  }
  if (std::find(c.sliding_layers.begin(), c.sliding_layers.end(), 1) == c.sliding_layers.end()) {
    c.sliding_layers.clear();
    return;
  }
  c.sliding_window = r.positive_int_or("sliding_window", kMaxIndex, 4096);
}

// GemmaConfig, Gemma2Config and Gemma3TextConfig with their defaults: GeGLU, norms by 1 + weight,
// tied embeddings; Gemma 2 and 3 add the norms after attention and MLP, the query_pre_attn_scalar
// and the sliding-window layers of layer_types, Gemma 2 the soft caps, Gemma 3 per-head q/k norms.
void parse_gemma(const Reader& r, ModelConfig& c) {
  const bool gemma1 = c.model_type == "gemma", gemma3 = c.model_type == "gemma3_text";
  c.gelu_gate = true;
  c.norm_offset = 1.f;
  c.tie_embeddings = r.bool_or("tie_word_embeddings", true);
  c.attention_bias = c.o_bias = r.bool_or("attention_bias", false);
  // GemmaConfig reads hidden_act, whose legacy "gelu" it takes for the tanh approximation.
  std::string act =
      gemma1 ? r.string_or("hidden_act", "gelu_pytorch_tanh") : r.string_or("hidden_activation", "gelu_pytorch_tanh");
  if (gemma1 && act == "gelu") act = "gelu_pytorch_tanh";
  if (act != "gelu_pytorch_tanh")
    FH_FAIL(r.source(), ": ", gemma1 ? "hidden_act" : "hidden_activation", " \"", act, "\" is not supported (",
            c.model_type, " uses gelu_pytorch_tanh)");
  if (gemma1) return;
  c.sandwich_norms = true;
  c.qk_norm = gemma3;
  c.query_pre_attn_scalar = r.positive_int_or("query_pre_attn_scalar", kMaxDim, 256);
  c.attn_softcap = softcap(r, "attn_logit_softcapping", gemma3 ? 0 : 50);
  c.final_softcap = softcap(r, "final_logit_softcapping", gemma3 ? 0 : 30);
  if (r.bool_or("use_bidirectional_attention", false))
    FH_FAIL(r.source(), ": use_bidirectional_attention (an embedding model's attention) is not supported");
  // layer_types, else every 2nd (Gemma 2) or sliding_window_pattern-th (Gemma 3, 6) layer is full.
  const int64_t pattern = gemma3 ? r.positive_int_or("sliding_window_pattern", kMaxCount, 6) : 2;
  read_sliding_layers(r, c, [&](int64_t i) { return (i + 1) % pattern != 0; });
}

// Gemma 3's two ropes: the full-attention layers' from rope_parameters.full_attention (or the
// top-level rope_scaling, which transformers merges into it, and rope_theta, 1e6 by default), the
// sliding-window layers' from rope_parameters.sliding_attention (or rope_local_base_freq, 1e4).
// Each is parsed by parse_rope over the config with that entry as its rope_parameters.
void parse_gemma3_ropes(const Reader& r, ModelConfig& c, int64_t* positions) {
  const json& j = r.object();
  const json* rp = r.has("rope_parameters") ? &j["rope_parameters"] : nullptr;
  if (rp && !rp->is_object()) FH_FAIL(r.source(), ": \"rope_parameters\" must be an object, got ", json_excerpt(*rp));
  if (rp)
    for (const auto& [name, value] : rp->items())
      if (name != "full_attention" && name != "sliding_attention")
        FH_FAIL(r.source(), ": gemma3_text's \"rope_parameters\" must be per layer type (full_attention, ",
                "sliding_attention), got entry \"", name, "\"");
  auto entry = [&](const char* type) {
    if (!rp || !rp->contains(type) || (*rp)[type].is_null()) return json::object();
    if (!(*rp)[type].is_object())
      FH_FAIL(r.source(), ": \"rope_parameters\" entry \"", type, "\" must be an object, got ",
              json_excerpt((*rp)[type]));
    return (*rp)[type];
  };
  json full = entry("full_attention"), local = entry("sliding_attention");
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) full.update(j["rope_scaling"]);
  if (!full.contains("rope_theta")) full["rope_theta"] = r.number_or("rope_theta", 1e6);
  if (!local.contains("rope_theta")) local["rope_theta"] = r.number_or("rope_local_base_freq", 1e4);
  auto parse = [&](json params, const char* type, int64_t* pos) {
    json cfg = j;
    cfg.erase("rope_scaling");
    cfg.erase("rope_theta");
    cfg["rope_parameters"] = std::move(params);
    return model_detail::parse_rope(Reader(cfg, r.source() + " (" + type + " layers)"), c.head_dim, c.max_positions,
                                    false, pos);
  };
  int64_t local_positions = 0;
  c.rope = parse(std::move(full), "full_attention", positions);
  c.rope_local = parse(std::move(local), "sliding_attention", &local_positions);
  c.has_local_rope = true;
  *positions = std::min(*positions, local_positions);
}

void parse_llama(const Reader& r, ModelConfig& c) {
  c.arch = Arch::kLlama;
  c.ffn_dim = r.positive_int("intermediate_size", kMaxDim);
  c.n_kv_heads = r.positive_int_or("num_key_value_heads", kMaxCount, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    FH_FAIL(r.source(), ": num_attention_heads (", c.n_heads, ") is not a multiple of num_key_value_heads (",
            c.n_kv_heads, ")");
  const double eps = r.number_or("rms_norm_eps", 1e-6);
  if (!(eps > 0 && eps <= 1))  // every norm divides by sqrt(var + eps): NaN below 0
    FH_FAIL(r.source(), ": \"rms_norm_eps\" must be a positive number up to 1, got ", eps);
  c.norm_eps = float(eps);
  c.tie_embeddings = r.bool_or("tie_word_embeddings", false);
  if (c.model_type == "qwen2") {  // Qwen2Attention: q/k/v with bias, o_proj without
    c.attention_bias = true;
  } else if (c.model_type == "qwen2_moe") {  // as Qwen2's, where qkv_bias (default true) says
    c.attention_bias = r.bool_or("qkv_bias", true);
  } else if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {  // per-head q_norm / k_norm
    c.qk_norm = true;
    c.attention_bias = c.o_bias = r.bool_or("attention_bias", false);
  } else if (c.model_type == "olmoe") {  // OlmoeAttention: q_norm over hidden_size, k_norm over kv_dim
    c.qk_norm = c.qk_norm_whole = true;
    c.attention_bias = r.bool_or("attention_bias", false);
    if (r.has("clip_qkv"))
      FH_FAIL(r.source(), ": clip_qkv (clamping q, k and v) is not supported, got ",
              json_excerpt(r.object()["clip_qkv"]));
  } else if (c.model_type == "phi3") {  // no biases; q/k/v and gate/up stored fused
    c.fused_projections = true;
  } else if (is_one_of(c.model_type, kGemmaTypes)) {
    parse_gemma(r, c);
    return;
  } else {
    c.attention_bias = c.o_bias = r.bool_or("attention_bias", false);
    c.mlp_bias = r.bool_or("mlp_bias", false);
  }
  std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu")
    FH_FAIL(r.source(), ": hidden_act \"", act, "\" is not supported (", c.model_type, " uses silu)");
  if (is_one_of(c.model_type, kMoeTypes)) parse_moe(r, c);
  // The sliding-window layers as transformers 5 reads them. Mistral, Mixtral, Phi-3: all layers,
  // unless sliding_window is null (Mixtral's and Phi-3's default). Qwen2/3 and their MoEs only with
  // use_sliding_window: Qwen2/3 the layers from max_window_layers (28) on, Qwen2-MoE the even ones
  // below it, Qwen3-MoE all, unless layer_types lists them.
  const std::string& t = c.model_type;
  const json& j = r.object();
  const bool null_window = j.contains("sliding_window") && j["sliding_window"].is_null();
  const bool absent_means_none = t == "mixtral" || t == "phi3";
  if (t == "mistral" || absent_means_none) {
    if (!null_window && (r.has("sliding_window") || !absent_means_none)) {
      c.sliding_layers.assign(size_t(c.n_layers), 1);
      c.sliding_window = r.positive_int_or("sliding_window", kMaxIndex, 4096);
    }
  } else if (t != "olmoe" && t != "llama" && r.bool_or("use_sliding_window", false) && !null_window) {
    const int64_t from = r.count_or("max_window_layers", kMaxCount, 28);
    if (t == "qwen3_moe")
      read_sliding_layers(r, c, [](int64_t) { return true; });
    else if (t == "qwen2_moe")
      read_sliding_layers(r, c, [&](int64_t i) { return (i + 1) % 2 != 0 && i < from; });
    else
      read_sliding_layers(r, c, [&](int64_t i) { return i >= from; });
  }
}

ModelConfig parse_object(const json& j, const std::string& source);

// Gemma3TextConfig's defaults for the keys a config may leave out (the multimodal checkpoints'
// text_config lists only what differs, e.g. Gemma 3 4B's hidden_size and layer count).
json with_gemma3_defaults(json t) {
  const std::pair<const char*, int64_t> defaults[] = {{"vocab_size", 262208},      {"hidden_size", 2304},
                                                      {"intermediate_size", 9216}, {"num_hidden_layers", 26},
                                                      {"num_attention_heads", 8},  {"num_key_value_heads", 4},
                                                      {"head_dim", 256},           {"max_position_embeddings", 131072}};
  for (const auto& [key, value] : defaults)
    if (!t.contains(key)) t[key] = value;
  return t;
}

// Gemma3ForConditionalGeneration (model_type gemma3): the engine runs its text model, whose
// config is text_config (with the top level's name, dtype and tie_word_embeddings where it has
// none) and whose weights are named language_model.model.*; the vision tower is not read.
ModelConfig parse_gemma3_multimodal(const json& j, const std::string& source) {
  if (!j.contains("text_config") || !j["text_config"].is_object())
    FH_FAIL(source, ": a gemma3 (multimodal) config needs a \"text_config\" object");
  json t = j["text_config"];
  if (t.contains("model_type") && t["model_type"] != "gemma3_text")
    FH_FAIL(source, ": text_config has model_type ", json_excerpt(t["model_type"]), ", expected \"gemma3_text\"");
  t["model_type"] = "gemma3_text";
  for (const char* key :
       {"_name_or_path", "torch_dtype", "dtype", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"})
    if (j.contains(key) && !t.contains(key)) t[key] = j[key];
  ModelConfig c = parse_object(with_gemma3_defaults(std::move(t)), source + " text_config");
  c.in_multimodal = true;
  return c;
}

}  // namespace

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  const json j = parse_json(text, source);
  if (!j.is_object()) FH_FAIL(source, ": expected a JSON object");
  refuse_quantized(j, source);  // at the top of a multimodal config, whose text part is read below
  if (j.contains("model_type") && j["model_type"] == "gemma3") return parse_gemma3_multimodal(j, source);
  if (j.contains("model_type") && j["model_type"] == "gemma3_text")
    return parse_object(with_gemma3_defaults(j), source);
  return parse_object(j, source);
}

namespace {

ModelConfig parse_object(const json& j, const std::string& source) {
  refuse_quantized(j, source);
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
  } else if (is_one_of(c.model_type, kDenseLlamaTypes) || is_one_of(c.model_type, kMoeTypes) ||
             is_one_of(c.model_type, kGemmaTypes)) {
    parse_llama(r, c);
  } else {
    std::string known = "opt";
    for (std::string_view t : kDenseLlamaTypes) known += ", " + std::string(t);
    for (std::string_view t : kMoeTypes) known += ", " + std::string(t);
    for (std::string_view t : kGemmaTypes) known += ", " + std::string(t);
    known += ", gemma3";
    FH_FAIL(source, ": unknown model_type \"", c.model_type, "\" (supported: ", known, ")");
  }
  c.head_dim = r.positive_int_or("head_dim", kMaxDim, c.hidden / c.n_heads);
  if (!r.has("head_dim") && c.hidden % c.n_heads != 0)
    FH_FAIL(source, ": hidden_size (", c.hidden, ") is not a multiple of num_attention_heads (", c.n_heads, ")");
  if (c.arch == Arch::kLlama) {
    int64_t positions = 0;
    if (c.model_type == "gemma3_text")
      parse_gemma3_ropes(r, c, &positions);
    else
      c.rope = model_detail::parse_rope(r, c.head_dim, c.max_positions, c.model_type == "phi3", &positions);
    c.max_positions = positions;
  }
  c.bos_id = r.token_id("bos_token_id");
  c.eos_ids = r.token_ids("eos_token_id");
  if (!c.eos_ids.empty()) c.eos_id = c.eos_ids[0];
  c.pad_id = r.token_id("pad_token_id");
  std::string dt = r.string_or("torch_dtype", r.string_or("dtype", "float16"));  // "dtype": transformers 5
  if (dt == "float32") c.dtype = DType::F32;
  else if (dt == "bfloat16") c.dtype = DType::BF16;
  else c.dtype = DType::F16;
  if (c.gelu_gate) {  // Gemma's sqrt(hidden), in the checkpoint's dtype as transformers computes it
    const float scale = std::sqrt(float(c.hidden));
    c.embed_scale = c.dtype == DType::BF16  ? bf16_to_f32(f32_to_bf16(scale))
                    : c.dtype == DType::F16 ? f16_to_f32(f32_to_f16(scale))
                                            : scale;
  }
  return c;
}

}  // namespace

ModelConfig ModelConfig::from_file(const std::filesystem::path& path) {
  ModelConfig c = from_json_text(read_input_file(path, "model config"), path.string());
  if (!c.name.empty()) return c;
  // A Hugging Face cache snapshot (.../models--ORG--NAME/snapshots/REVISION) is named by its
  // repository, not by the revision's hash.
  const std::filesystem::path dir = path.parent_path();
  const std::string repo = dir.parent_path().parent_path().filename().string();
  if (dir.parent_path().filename() == "snapshots" && repo.starts_with("models--") && repo.size() > 8) {
    c.name = repo.substr(8);
    if (const size_t at = c.name.find("--"); at != std::string::npos) c.name.replace(at, 2, "/");
  } else {
    c.name = dir.filename().string();
  }
  return c;
}

void check_token_ids(std::span<const int32_t> ids, const ModelConfig& c, const char* what) {
  for (const int32_t id : ids)
    if (id < 0 || id >= c.vocab_size)
      FH_FAIL(what, " token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")");
}

}  // namespace flexh2o
