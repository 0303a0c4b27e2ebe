// Gemma (model_type gemma, gemma2, gemma3_text) at the config and loading level: each family's
// keys and transformers' defaults, the refusals, the norms' units (Gemma 2's post-attention norm
// belongs to the attention), Gemma 3's two ropes in either config format and the layers that
// use the local one, through stage(). Their logits against transformers: reference_test.cpp
// (arch_models); offloaded: offload_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "engine/cpu_device.h"
#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "loader/safetensors.h"
#include "loader/safetensors_writer.h"
#include "model/weights.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::error_of;
using test::model_dir;

nlohmann::json config_of(const char* model) { return test::read_json(model_dir(model) / "config.json"); }
ModelConfig parse(const nlohmann::json& j) { return ModelConfig::from_json_text(j.dump(), "c"); }

TEST(GemmaConfig, GemmaUsesGegluOffsetNormsAndScaledEmbeddings) {
  nlohmann::json j = config_of("arch/gemma");
  ModelConfig c = parse(j);
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_TRUE(c.gelu_gate);
  EXPECT_EQ(c.norm_offset, 1.f);
  EXPECT_EQ(c.embed_scale, 8.f);  // sqrt(64)
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FALSE(c.sandwich_norms || c.qk_norm || c.has_local_rope);
  EXPECT_EQ(c.attention_scale(), 1.f / 8);
  EXPECT_EQ(c.attn_softcap, 0.f);
  EXPECT_TRUE(c.sliding_layers.empty());
  j["hidden_act"] = "gelu";  // the first releases' spelling of the tanh approximation
  EXPECT_TRUE(parse(j).gelu_gate);
  j["hidden_act"] = "relu";
  EXPECT_NE(error_of([&] { parse(j); }).find("hidden_act \"relu\" is not supported"), std::string::npos);
  // sqrt(hidden) in the checkpoint's dtype, as transformers rounds it: Gemma 2 9B's 3584.
  j = config_of("arch/gemma");
  j["hidden_size"] = 3584;
  j["head_dim"] = 256;
  j["dtype"] = "bfloat16";
  EXPECT_EQ(parse(j).embed_scale, 59.75f);
  j["dtype"] = "float16";
  EXPECT_EQ(parse(j).embed_scale, 59.875f);
  j["dtype"] = "float32";
  EXPECT_EQ(parse(j).embed_scale, std::sqrt(3584.f));
}

TEST(GemmaConfig, Gemma2SoftCapsScalarAndSlidingLayers) {
  nlohmann::json j = config_of("arch/gemma2");
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.gelu_gate && c.sandwich_norms);
  EXPECT_FALSE(c.qk_norm || c.has_local_rope);
  EXPECT_EQ(c.query_pre_attn_scalar, 48);
  EXPECT_EQ(c.attention_scale(), 1.f / std::sqrt(48.f));
  EXPECT_EQ(c.attn_softcap, 5.f);
  EXPECT_EQ(c.final_softcap, 3.f);
  EXPECT_EQ(c.sliding_layers, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(c.sliding_window, 20);
  EXPECT_EQ(c.attention_window(0), 20);
  EXPECT_EQ(c.attention_window(1), 0);
  EXPECT_EQ(c.max_positions, 128);  // the window does not cap the positions
  // Gemma2Config's defaults: caps 50 and 30, scalar 256, every other layer sliding from the first.
  j.erase("attn_logit_softcapping"), j.erase("final_logit_softcapping"), j.erase("query_pre_attn_scalar");
  j.erase("layer_types");
  j["num_hidden_layers"] = 4;
  c = parse(j);
  EXPECT_EQ(c.attn_softcap, 50.f);
  EXPECT_EQ(c.final_softcap, 30.f);
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.sliding_layers, (std::vector<uint8_t>{1, 0, 1, 0}));
  j["final_logit_softcapping"] = nullptr;  // null: no cap
  EXPECT_EQ(parse(j).final_softcap, 0.f);
  j.erase("sliding_window");  // Gemma2Config's default
  EXPECT_EQ(parse(j).sliding_window, 4096);
  // Only full layers: no window.
  j["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
  c = parse(j);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_TRUE(c.sliding_layers.empty());
  EXPECT_EQ(c.max_positions, 128);
}

TEST(GemmaConfig, RefusesWhatItCannotRun) {
  const nlohmann::json base = config_of("arch/gemma2");
  auto refused = [&](auto edit, const char* want) {
    nlohmann::json j = base;
    edit(j);
    const std::string e = error_of([&] { parse(j); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
  };
  refused([](auto& j) { j["use_bidirectional_attention"] = true; }, "use_bidirectional_attention");
  refused([](auto& j) { j["layer_types"] = {"full_attention"}; }, "\"layer_types\" must list the 2 layers");
  refused([](auto& j) { j["layer_types"][1] = "chunked_attention"; }, "entry 1 must be");
  refused([](auto& j) { j["attn_logit_softcapping"] = -1; }, "must be positive or null");
  refused([](auto& j) { j["hidden_activation"] = "silu"; }, "hidden_activation \"silu\" is not supported");
  nlohmann::json j = config_of("arch/gemma3_text_linear");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};  // flat: not per layer type
  EXPECT_NE(error_of([&] { parse(j); }).find("must be per layer type"), std::string::npos);
}

TEST(GemmaConfig, Gemma3HasARopePerLayerTypeInEitherFormat) {
  nlohmann::json j = config_of("arch/gemma3_text_linear");
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.qk_norm && !c.qk_norm_whole && c.sandwich_norms && c.has_local_rope);
  EXPECT_EQ(c.attn_softcap, 0.f);
  EXPECT_EQ(c.final_softcap, 0.f);
  EXPECT_EQ(c.rope.type, "linear");
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.factor, 2);
  EXPECT_EQ(c.rope_local.type, "default");
  EXPECT_EQ(c.rope_local.theta, 1e4);
  EXPECT_TRUE(c.local_rope_layer(0));
  EXPECT_FALSE(c.local_rope_layer(1));
  // The older format: rope_scaling for the full layers, rope_theta and rope_local_base_freq.
  j.erase("rope_parameters");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  j["rope_local_base_freq"] = 5000.0;
  c = parse(j);
  EXPECT_EQ(c.rope.type, "linear");
  EXPECT_EQ(c.rope.factor, 8);
  EXPECT_EQ(c.rope.theta, 1e6);  // Gemma3TextConfig's default global theta
  EXPECT_EQ(c.rope_local.theta, 5000);
  EXPECT_EQ(c.rope_local.type, "default");
  // Without layer_types: every sliding_window_pattern-th layer (6) is full.
  j.erase("layer_types");
  j["num_hidden_layers"] = 12;
  c = parse(j);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(c.local_rope_layer(i), i != 5 && i != 11) << i;
}

// The norms' units: Gemma 2's post_attention_layernorm normalizes the attention output (the
// attention unit); pre/post_feedforward_layernorm are the MLP's. In Gemma 1 (and LLaMA)
// post_attention_layernorm is the MLP's input norm.
TEST(GemmaWeights, NormsBelongToTheirUnitsAndStagesKeepLocalRopes) {
  auto part_of = [](const ModelConfig& c, const std::string& name) {
    for (const WeightSpec& s : weight_specs(c))
      if (s.name == name) return s.part;
    ADD_FAILURE() << name << " not in the specs";
    return LayerPart::kNone;
  };
  const ModelConfig g2 = parse(config_of("arch/gemma2")), g1 = parse(config_of("arch/gemma"));
  EXPECT_EQ(part_of(g2, "model.layers.1.post_attention_layernorm.weight"), LayerPart::kAttention);
  EXPECT_EQ(part_of(g2, "model.layers.1.pre_feedforward_layernorm.weight"), LayerPart::kMlp);
  EXPECT_EQ(part_of(g2, "model.layers.1.post_feedforward_layernorm.weight"), LayerPart::kMlp);
  EXPECT_EQ(part_of(g1, "model.layers.1.post_attention_layernorm.weight"), LayerPart::kMlp);

  Model m = Model::load_dir(model_dir("arch/gemma3_text_linear"));
  const LayerWeights& L0 = m.weights().layers[0];
  EXPECT_TRUE(L0.local_rope);
  EXPECT_FALSE(m.weights().layers[1].local_rope);
  EXPECT_FALSE(L0.post_attn_norm_w.empty() || L0.post_ffn_norm_w.empty() || L0.ln2_w.empty());
  EXPECT_NE(L0.ln2_w.data, L0.post_attn_norm_w.data);
  Model second = m.stage(1, 2);
  EXPECT_EQ(second.config().sliding_layers, (std::vector<uint8_t>{0}));
  EXPECT_FALSE(second.weights().layers[0].local_rope);
  EXPECT_TRUE(m.stage(0, 1).weights().layers[0].local_rope);
}

// Gemma3ForConditionalGeneration: the text model of text_config, with Gemma3TextConfig's defaults
// for what it leaves out and the top level's dtype; weights named language_model.model.* as
// transformers saves them, or model.language_model.* as it holds them, with the same logits.
TEST(GemmaMultimodal, TheTextModelOfAGemma3CheckpointInEitherLayout) {
  nlohmann::json j = config_of("arch/gemma3_text_mm");
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.in_multimodal);
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.query_pre_attn_scalar, 48);
  EXPECT_EQ(c.dtype, DType::F16);
  EXPECT_EQ(weight_specs(c).front().name, "language_model.model.embed_tokens.weight");
  // Gemma 3 4B's text_config as published lists five keys; the rest are Gemma3TextConfig's.
  j["text_config"] = {{"hidden_size", 2560},         {"intermediate_size", 10240},
                      {"model_type", "gemma3_text"}, {"num_hidden_layers", 34},
                      {"sliding_window", 1024},      {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}}};
  j["torch_dtype"] = "bfloat16";
  c = parse(j);
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.dtype, DType::BF16);
  EXPECT_EQ(c.rope.factor, 8);
  EXPECT_EQ(c.max_positions, 131072);  // its global layers' context; the others see 1024
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_EQ(std::count(c.sliding_layers.begin(), c.sliding_layers.end(), 1), 34 - 5);  // layers 5, 11, ... full
  j.erase("text_config");
  EXPECT_NE(error_of([&] { parse(j); }).find("needs a \"text_config\" object"), std::string::npos);

  test::TempDir tmp;
  std::filesystem::copy_file(model_dir("arch/gemma3_text_mm") / "config.json", tmp.path() / "config.json");
  SafetensorsArchive a = SafetensorsArchive::open_dir(model_dir("arch/gemma3_text_mm"));
  std::vector<std::pair<std::string, TensorView>> t;
  for (const auto& e : a.tensors()) {
    std::string name = e.name;
    if (name.starts_with("language_model.model.")) name = "model.language_model." + name.substr(21);
    t.push_back({name, e.view});
  }
  write_safetensors(tmp.path() / "model.safetensors", t);
  Model saved = Model::load_dir(model_dir("arch/gemma3_text_mm")), held = Model::load_dir(tmp.path());
  CpuDevice dev(1);
  Forward fa(saved, dev), fb(held, dev);
  const std::vector<int32_t> ids = {5, 17, 99, 3, 64};
  std::vector<int32_t> pos = {0, 1, 2, 3, 4};
  std::vector<float> la, lb;
  KvCache ca(saved.config(), 1, 5), cb(held.config(), 1, 5);
  fa.step(ids.data(), pos.data(), 5, nullptr, ca, LogitsRows::kAll, la);
  fb.step(ids.data(), pos.data(), 5, nullptr, cb, LogitsRows::kAll, lb);
  EXPECT_EQ(la, lb);
}

// The largest |logit - transformers'| of the last reference prompt's last position, as a fraction
// of that row's spread, for the checkpoint of `model` read with `config` as its config.json.
double last_logit_error(const char* model, const nlohmann::json& config) {
  test::TempDir tmp;
  std::filesystem::copy_file(model_dir(model) / "model.safetensors", tmp.path() / "model.safetensors");
  std::ofstream(tmp.path() / "config.json") << config.dump();
  Model m = Model::load_dir(tmp.path());
  CpuDevice dev(1);
  Forward fwd(m, dev);
  const nlohmann::json p = test::read_json(model_dir(model) / "reference" / "logits.json")["prompts"].back();
  const auto ids = p["ids"].get<std::vector<int32_t>>();
  const auto want = p["last_logits"].get<std::vector<float>>();
  KvCache cache(m.config(), 1, int64_t(ids.size()));
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  std::vector<float> logits;
  fwd.step(ids.data(), pos.data(), int64_t(ids.size()), nullptr, cache, LogitsRows::kLast, logits);
  const auto [mn, mx] = std::minmax_element(want.begin(), want.end());
  double worst = 0;
  for (size_t v = 0; v < want.size(); ++v) worst = std::max(worst, std::abs(double(logits.at(v)) - want[v]));
  return std::isnan(worst) ? 1e9 : worst / (*mx - *mn);
}

// Each setting that only Gemma has moves the logits far beyond the 1e-4 of the spread the arch
// references allow (reference_test.cpp), so those references check every one of them.
TEST(GemmaReference, EachSettingMovesTheLogits) {
  using Edit = std::function<void(nlohmann::json&)>;
  const std::vector<std::tuple<const char*, const char*, Edit>> cases = {
      {"arch/gemma2", "unchanged", [](auto&) {}},
      {"arch/gemma2", "no attention soft cap", [](auto& j) { j["attn_logit_softcapping"] = nullptr; }},
      {"arch/gemma2", "no final soft cap", [](auto& j) { j["final_logit_softcapping"] = nullptr; }},
      {"arch/gemma2", "the head_dim scale", [](auto& j) { j["query_pre_attn_scalar"] = 64; }},
      {"arch/gemma3_text_linear", "unchanged", [](auto&) {}},
      {"arch/gemma3_text_linear", "the global rope everywhere",
       [](auto& j) { j["rope_parameters"]["sliding_attention"] = j["rope_parameters"]["full_attention"]; }},
      {"arch/gemma3_text_linear", "the local rope everywhere",
       [](auto& j) { j["rope_parameters"]["full_attention"] = j["rope_parameters"]["sliding_attention"]; }},
  };
  for (const auto& [model, what, edit] : cases) {
    nlohmann::json j = config_of(model);
    edit(j);
    const double err = last_logit_error(model, j);
    if (std::string(what) == "unchanged")
      EXPECT_LT(err, 1e-4) << model;
    else
      EXPECT_GT(err, 1e-2) << model << ": " << what;
  }
}

}  // namespace
}  // namespace flexh2o
