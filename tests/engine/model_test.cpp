// Model loading edge cases and bad input: config.json problems, missing or misshapen tensors,
// dummy weights, request validation. Every error must name the file/tensor/field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "engine/generate.h"
#include "loader/safetensors.h"
#include "loader/safetensors_writer.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;
using test::TempDir;

using test::error_of;

nlohmann::json tiny_config() { return test::read_json(model_dir("tiny-opt") / "config.json"); }

TEST(ModelConfig, ParsesBothFamilies) {
  ModelConfig o = ModelConfig::from_file(model_dir("tiny-opt") / "config.json");
  EXPECT_EQ(o.arch, Arch::kOpt);
  EXPECT_EQ(o.hidden, 256);
  EXPECT_EQ(o.n_kv_heads, 4);
  EXPECT_EQ(o.head_dim, 64);
  EXPECT_EQ(o.position_offset(), 2);
  ModelConfig l = ModelConfig::from_file(model_dir("tiny-llama") / "config.json");
  EXPECT_EQ(l.arch, Arch::kLlama);
  EXPECT_EQ(l.n_kv_heads, 2);
  EXPECT_FALSE(l.tie_embeddings);
  EXPECT_EQ(l.ffn_dim, 688);
  EXPECT_EQ(l.kv_bytes_per_token(DType::F16), 2 * 4 * 2 * 64 * 2);
}

// model_type mistral and qwen2 run the LLaMA path with their differences: Qwen2's q/k/v biases
// without an o_proj bias; sliding-window layers (Mistral's sliding_window: every layer; Qwen2's
// only with use_sliding_window: those from max_window_layers on, or as layer_types says), which
// leave the positions as they are.
TEST(ModelConfig, MistralAndQwen2AreLlamaWithTheirDifferences) {
  auto j = test::read_json(model_dir("tiny-llama") / "config.json");
  j["model_type"] = "mistral";
  j["max_position_embeddings"] = 4096;
  j["sliding_window"] = 1024;
  ModelConfig m = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(m.arch, Arch::kLlama);
  EXPECT_EQ(m.sliding_window, 1024);
  EXPECT_EQ(m.max_positions, 4096);
  for (int64_t l = 0; l < m.n_layers; ++l) EXPECT_EQ(m.attention_window(l), 1024) << "layer " << l;
  EXPECT_EQ(m.attention_window(m.n_layers), 0);
  EXPECT_FALSE(m.attention_bias || m.o_bias || m.mlp_bias);
  j["sliding_window"] = nullptr;  // Mistral v0.2 and later
  m = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(m.sliding_window, 0);
  EXPECT_EQ(m.attention_window(0), 0);
  EXPECT_EQ(m.max_positions, 4096);
  j.erase("sliding_window");  // MistralConfig's default
  EXPECT_EQ(ModelConfig::from_json_text(j.dump(), "c").attention_window(0), 4096);
  j["sliding_window"] = 0;
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("sliding_window"), std::string::npos);
  j["model_type"] = "mixtral";  // MixtralConfig's default: no window
  j["num_local_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j.erase("sliding_window");
  EXPECT_EQ(ModelConfig::from_json_text(j.dump(), "c").sliding_window, 0);

  j = test::read_json(model_dir("tiny-llama") / "config.json");
  j["max_position_embeddings"] = 4096;
  j["model_type"] = "qwen2";
  j["sliding_window"] = 1024;  // Qwen2 configs carry one, used only with use_sliding_window
  ModelConfig q = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_TRUE(q.attention_bias);
  EXPECT_FALSE(q.o_bias || q.mlp_bias);
  EXPECT_EQ(q.sliding_window, 0);
  EXPECT_TRUE(q.sliding_layers.empty());
  j["use_sliding_window"] = true;  // max_window_layers 28 by default: no layer of 2 slides
  q = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(q.sliding_window, 0);
  EXPECT_EQ(q.attention_window(1), 0);
  j["max_window_layers"] = 1;
  q = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(q.attention_window(0), 0);
  EXPECT_EQ(q.attention_window(1), 1024);
  EXPECT_EQ(q.max_positions, 4096);
  j["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "full_attention"};
  q = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(q.attention_window(0), 1024);
  EXPECT_EQ(q.attention_window(1), 0);
  j["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention", "full_attention"};
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("layer_types"), std::string::npos);
  j.erase("layer_types");
  j["model_type"] = "qwen2_moe";  // the even layers below max_window_layers
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  j["shared_expert_intermediate_size"] = 32;
  j["max_window_layers"] = 28;
  q = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(q.attention_window(0), 1024);
  EXPECT_EQ(q.attention_window(1), 0);
  EXPECT_EQ(q.attention_window(2), 1024);
  j["model_type"] = "qwen2";
  j["hidden_act"] = "gelu";
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("qwen2 uses silu"), std::string::npos);
}

// transformers 5 writes rope_parameters and dtype where earlier versions wrote rope_theta and
// torch_dtype (the rope types themselves: tests/model/rope_test.cpp).
TEST(ModelConfig, Transformers5RopeParametersAndDtype) {
  auto j = test::read_json(model_dir("tiny-llama") / "config.json");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  j["dtype"] = "bfloat16";
  ModelConfig c = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.inv_freq.size(), size_t(c.head_dim / 2));
  EXPECT_EQ(c.dtype, DType::BF16);
  j["rope_parameters"] = {{"rope_type", "mrope"}, {"rope_theta", 1e6}, {"factor", 4.0}};
  const std::string msg = error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); });
  EXPECT_NE(msg.find("rope_type \"mrope\""), std::string::npos) << msg;
  j["rope_parameters"] = "default";
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("must be an object"), std::string::npos);
  j["rope_parameters"] = {{"rope_theta", "big"}};
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("rope_parameters: \"rope_theta\""),
            std::string::npos);
}

TEST(ModelConfig, MissingKeyIsNamed) {
  auto j = tiny_config();
  j.erase("num_attention_heads");
  std::string msg = error_of([&] { ModelConfig::from_json_text(j.dump(), "x/config.json"); });
  EXPECT_NE(msg.find("x/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("num_attention_heads"), std::string::npos) << msg;
}

TEST(ModelConfig, UnknownModelTypeIsNamed) {
  auto j = tiny_config();
  j["model_type"] = "bloom";
  std::string msg = error_of([&] { ModelConfig::from_json_text(j.dump(), "config.json"); });
  EXPECT_NE(msg.find("unknown model_type \"bloom\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("opt, llama, mistral, qwen2"), std::string::npos) << msg;
}

TEST(ModelConfig, BadValuesAndUnsupportedVariants) {
  auto j = tiny_config();
  j["hidden_size"] = -3;
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("hidden_size"), std::string::npos);
  j = tiny_config();
  j["do_layer_norm_before"] = false;
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("post-LN"), std::string::npos);
  const std::string bad_json = error_of([&] { ModelConfig::from_json_text("{nope", "c"); });
  EXPECT_NE(bad_json.find("c is not valid JSON: parse error at line 1, column 3: syntax error"), std::string::npos)
      << bad_json;
  EXPECT_EQ(bad_json.find("[json.exception"), std::string::npos) << bad_json;
  EXPECT_NE(error_of([&] { ModelConfig::from_file("/nonexistent/config.json"); }).find("/nonexistent/config.json"),
            std::string::npos);
}

// Copies model `src` (tiny-opt by default) into `dst`, applying `edit` to the tensor list first.
void write_edited(const std::filesystem::path& dst,
                  const std::function<void(std::vector<std::pair<std::string, TensorView>>&)>& edit,
                  const std::string& src = "tiny-opt") {
  test::copy_model_files(model_dir(src), dst);
  SafetensorsArchive a = SafetensorsArchive::open_dir(model_dir(src));
  std::vector<std::pair<std::string, TensorView>> t;
  for (const auto& e : a.tensors()) t.push_back({e.name, e.view});
  edit(t);
  write_safetensors(dst / "model.safetensors", t);
}

TEST(ModelLoad, MissingTensorIsNamed) {
  TempDir tmp;
  write_edited(tmp.path(), [](auto& t) {
    std::erase_if(t, [](const auto& p) { return p.first == "model.decoder.layers.2.fc1.bias"; });
  });
  std::string msg = error_of([&] { Model::load_dir(tmp.path()); });
  EXPECT_NE(msg.find("model.decoder.layers.2.fc1.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(ModelLoad, ShapeDisagreeingWithConfigIsNamed) {
  TempDir tmp;
  write_edited(tmp.path(), [](auto& t) {
    for (auto& [n, v] : t)
      if (n == "model.decoder.layers.1.fc2.weight") v.shape = Shape{256, 512};  // half of [256, 1024]
  });
  std::string msg = error_of([&] { Model::load_dir(tmp.path()); });
  EXPECT_NE(msg.find("model.decoder.layers.1.fc2.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[256, 512]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[256, 1024]"), std::string::npos) << msg;
}

TEST(ModelLoad, ConfigDisagreeingWithTensors) {
  TempDir tmp;
  write_edited(tmp.path(), [](auto&) {});
  auto j = tiny_config();
  j["ffn_dim"] = 2048;
  std::ofstream(tmp.path() / "config.json") << j.dump();
  std::string msg = error_of([&] { Model::load_dir(tmp.path()); });
  EXPECT_NE(msg.find("fc1.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json implies [2048, 256]"), std::string::npos) << msg;
}

// A config that ties the head to the token table over a checkpoint with a head of its own:
// transformers' tie_weights() keeps that head when its values differ (the config is wrong), and
// ties when they are the token table's (as .bin files store both).
TEST(ModelLoad, AHeadOfItsOwnWinsOverATieInTheConfig) {
  for (bool same : {false, true}) {
    TempDir tmp;
    std::vector<std::byte> embed;
    write_edited(
        tmp.path(),
        [&](auto& t) {
          const TensorView* e = nullptr;
          for (auto& [n, v] : t)
            if (n == "model.embed_tokens.weight") e = &v;
          ASSERT_NE(e, nullptr);
          embed.assign(static_cast<const std::byte*>(e->data), static_cast<const std::byte*>(e->data) + e->nbytes());
          for (auto& [n, v] : t)
            if (same && n == "lm_head.weight") v.data = embed.data();
        },
        "tiny-llama");
    auto j = test::read_json(model_dir("tiny-llama") / "config.json");
    j["tie_word_embeddings"] = true;
    std::ofstream(tmp.path() / "config.json") << j.dump();
    const Model m = Model::load_dir(tmp.path());
    const Model untied = Model::load_dir(model_dir("tiny-llama"));
    EXPECT_EQ(m.config().tie_embeddings, same);
    const TensorView& head = m.weights().lm_head;
    ASSERT_EQ(head.nbytes(), embed.size());
    if (same) {
      EXPECT_EQ(std::memcmp(head.data, embed.data(), embed.size()), 0);
    } else {
      EXPECT_EQ(std::memcmp(head.data, untied.weights().lm_head.data, embed.size()), 0);
      EXPECT_NE(std::memcmp(head.data, embed.data(), embed.size()), 0);
    }
  }
}

// Tensors no weight reads are listed, sorted by name (a stage keeps the list); a
// rotary frequency buffer and a multimodal checkpoint's vision tower are not.
TEST(ModelLoad, TensorsTheConfigDoesNotReadAreListed) {
  TempDir tmp;
  write_edited(tmp.path(), [](auto& t) {
    const TensorView v = t[0].second;
    t.push_back({"model.decoder.layers.0.self_attn.q_norm.weight", v});
    t.push_back({"model.decoder.layers.0.self_attn.rotary_emb.inv_freq", v});
    t.push_back({"vision_tower.blocks.0.weight", v});
    t.push_back({"extra.weight", v});
  });
  const Model m = Model::load_dir(tmp.path());
  const std::vector<std::string> want = {"extra.weight", "model.decoder.layers.0.self_attn.q_norm.weight"};
  EXPECT_EQ(m.unused_tensors(), want);
  EXPECT_EQ(m.stage(1, 2).unused_tensors(), want);
  EXPECT_TRUE(Model::load_dir(model_dir("tiny-opt")).unused_tensors().empty());
  EXPECT_TRUE(Model::load_dir(model_dir("arch/gemma3_text_mm")).unused_tensors().empty());
}

TEST(ModelLoad, IntegerWeightRejected) {
  TempDir tmp;
  std::vector<int32_t> ints(256, 1);
  write_edited(tmp.path(), [&](auto& t) {
    for (auto& [n, v] : t)
      if (n == "model.decoder.final_layer_norm.bias") v = TensorView{ints.data(), DType::I32, Shape{256}};
  });
  std::string msg = error_of([&] { Model::load_dir(tmp.path()); });
  EXPECT_NE(msg.find("final_layer_norm.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("I32"), std::string::npos) << msg;
}

TEST(ModelLoad, MissingConfigAndWeightsAreNamed) {
  TempDir tmp;
  EXPECT_NE(error_of([&] { Model::load_dir(tmp.path()); }).find("config.json"), std::string::npos);
  test::copy_model_files(model_dir("tiny-opt"), tmp.path());
  EXPECT_NE(error_of([&] { Model::load_dir(tmp.path()); }).find("model.safetensors"), std::string::npos);
}

// Qwen3: the LLaMA path with q_norm / k_norm ([head_dim] each, attention weights) and LLaMA's
// optional attention_bias.
TEST(ModelConfig, Qwen3HasPerHeadQkNorms) {
  auto j = test::read_json(model_dir("arch/qwen3") / "config.json");
  ModelConfig c = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 64);  // explicit, over hidden 64 and 2 heads
  EXPECT_FALSE(c.attention_bias || c.o_bias);
  int norms = 0;
  for (const WeightSpec& s : weight_specs(c))
    if (s.name.find("_norm.weight") != std::string::npos && s.name.find("self_attn.") != std::string::npos) {
      EXPECT_EQ(s.shape, (Shape{64})) << s.name;
      EXPECT_EQ(s.part, LayerPart::kAttention) << s.name;
      ++norms;
    }
  EXPECT_EQ(norms, 2 * c.n_layers);
  j["attention_bias"] = true;
  c = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_TRUE(c.attention_bias && c.o_bias);
  j["use_sliding_window"] = true;  // Qwen3: the layers from max_window_layers on slide
  j["sliding_window"] = 20;
  j["max_window_layers"] = 1;
  j.erase("layer_types");  // what transformers saved for the model without a window
  c = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(c.attention_window(0), 0);
  EXPECT_EQ(c.attention_window(1), 20);
  EXPECT_EQ(c.max_positions, 128);
}

// Phi-3: the LLaMA path reading q/k/v and gate/up as row ranges of qkv_proj and gate_up_proj
// (its logits against transformers: reference_test.cpp).
TEST(ModelConfig, Phi3IsLlamaWithFusedProjections) {
  auto j = test::read_json(model_dir("arch/phi3") / "config.json");
  ModelConfig c = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_TRUE(c.fused_projections);
  EXPECT_FALSE(c.attention_bias || c.o_bias || c.mlp_bias);
  EXPECT_EQ(c.sliding_window, 19);
  EXPECT_EQ(c.attention_window(0), 19);
  EXPECT_EQ(c.max_positions, 128);
  // Phi3Config: "su" and "yarn" mean longrope; without a top-level original_max_position_embeddings
  // the pretraining length is 4096 (its default), whatever the rope settings say.
  j["max_position_embeddings"] = 131072;
  j["sliding_window"] = nullptr;
  j["rope_scaling"] = {{"type", "su"},
                       {"original_max_position_embeddings", 8192},
                       {"short_factor", std::vector<double>(32, 1.5)},
                       {"long_factor", std::vector<double>(32, 4.0)}};
  c = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(c.rope.type, "longrope");
  EXPECT_EQ(c.rope.original_max_positions, 4096);
  EXPECT_EQ(c.max_positions, 4096);
  EXPECT_NEAR(c.rope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-12);
  j["model_type"] = "llama";  // the same settings elsewhere: "su" is no rope type
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("rope_type \"su\""), std::string::npos);
  // Phi-4-mini rotates 3/4 of each head (its factor at the top level); other model types refuse it.
  j = test::read_json(model_dir("arch/phi3") / "config.json");
  j["rope_parameters"].erase("partial_rotary_factor");
  j["partial_rotary_factor"] = 0.75;
  c = ModelConfig::from_json_text(j.dump(), "c");
  EXPECT_EQ(c.rope.rotary_dims(), 48);
  EXPECT_NEAR(c.rope.inv_freq[1], std::pow(10000.0, -2.0 / 48), 1e-15);  // the exponent is over the rotary dims
  j["partial_rotary_factor"] = 0.02;                                     // 1.28 dimensions
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("= 1) must be even and at least 2"),
            std::string::npos);
  j["partial_rotary_factor"] = 0.75;
  j["model_type"] = "mistral";
  EXPECT_NE(error_of([&] { ModelConfig::from_json_text(j.dump(), "c"); }).find("partial_rotary_factor 0.75 is not"),
            std::string::npos);
}

TEST(ModelLoad, Phi3FusedTensorsAreReadInPlaceAndNamedInErrors) {
  const Model m = Model::load_dir(model_dir("arch/phi3"));
  const ModelConfig& c = m.config();
  SafetensorsArchive a = SafetensorsArchive::open_dir(model_dir("arch/phi3"));
  const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), F = c.ffn_dim;
  auto same = [&](const TensorView& part, const char* fused, int64_t row0) {
    const TensorEntry* e = a.find(std::string("model.layers.1.") + fused);
    EXPECT_TRUE(e && e->view.dtype == part.dtype);
    const size_t es = dtype_size(part.dtype), n = size_t(part.numel()) * es;
    return e && std::memcmp(part.data, static_cast<const std::byte*>(e->view.data) + size_t(row0 * H) * es, n) == 0;
  };
  const LayerWeights& L = m.weights().layers[1];
  EXPECT_EQ(L.q_w.shape, (Shape{Q, H}));
  EXPECT_EQ(L.v_w.shape, (Shape{KV, H}));
  EXPECT_TRUE(same(L.q_w, "self_attn.qkv_proj.weight", 0));
  EXPECT_TRUE(same(L.k_w, "self_attn.qkv_proj.weight", Q));
  EXPECT_TRUE(same(L.v_w, "self_attn.qkv_proj.weight", Q + KV));
  EXPECT_TRUE(same(L.gate_w, "mlp.gate_up_proj.weight", 0));
  EXPECT_TRUE(same(L.up_w, "mlp.gate_up_proj.weight", F));
  EXPECT_EQ(m.parameter_count(), 74048);  // transformers' count for the checkpoint

  TempDir tmp;
  write_edited(
      tmp.path(), [](auto&) {}, "arch/phi3");
  auto j = test::read_json(model_dir("arch/phi3") / "config.json");
  j["head_dim"] = 32;  // q, k and v of 32 rows each
  std::ofstream(tmp.path() / "config.json") << j.dump();
  std::string msg = error_of([&] { Model::load_dir(tmp.path()); });
  EXPECT_NE(msg.find("\"model.layers.1.self_attn.qkv_proj.weight\" has shape [192, 64] but config.json implies "
                     "[96, 64]"),
            std::string::npos)
      << msg;
  TempDir gone;
  write_edited(
      gone.path(),
      [](auto& t) {
        std::erase_if(t, [](const auto& p) { return p.first == "model.layers.1.mlp.gate_up_proj.weight"; });
      },
      "arch/phi3");
  msg = error_of([&] { Model::load_dir(gone.path()); });
  EXPECT_NE(msg.find("tensor \"model.layers.1.mlp.gate_up_proj.weight\" is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(12 layer tensors)"), std::string::npos) << msg;  // 6 a layer as Phi-3 stores them

  // The same weights stored split (as q_proj, ..., up_proj) under the phi3 config load as well.
  TempDir split;
  test::copy_model_files(model_dir("arch/phi3"), split.path());
  std::vector<std::pair<std::string, TensorView>> t;
  for (const BoundTensor& b : m.tensors()) t.push_back({b.spec.name, b.view});
  write_safetensors(split.path() / "model.safetensors", t);
  const Model s = Model::load_dir(split.path());
  EXPECT_EQ(std::memcmp(s.weights().layers[1].up_w.data, L.up_w.data, L.up_w.nbytes()), 0);
}

TEST(DummyWeights, DeterministicVariedAndRunnable) {
  ModelConfig c = ModelConfig::from_file(model_dir("tiny-llama") / "config.json");
  Model a = Model::dummy(c, 1), b = Model::dummy(c, 1), other = Model::dummy(c, 2);
  const TensorView& qa = a.weights().layers[1].q_w;
  ASSERT_EQ(qa.nbytes(), b.weights().layers[1].q_w.nbytes());
  EXPECT_EQ(0, std::memcmp(qa.data, b.weights().layers[1].q_w.data, qa.nbytes()));
  EXPECT_NE(0, std::memcmp(qa.data, other.weights().layers[1].q_w.data, qa.nbytes()));
  // Not constant: many distinct values, and different tensors differ.
  std::set<uint16_t> distinct(qa.as<uint16_t>(), qa.as<uint16_t>() + qa.numel());
  EXPECT_GT(distinct.size(), 1000u);
  EXPECT_NE(0, std::memcmp(qa.data, a.weights().layers[1].k_w.data, 1024));
  EXPECT_EQ(a.parameter_count(), Model::load_dir(model_dir("tiny-llama")).parameter_count());
  CpuDevice dev(2);
  Forward fwd(a, dev);
  GenerationRequest r;
  r.prompt_ids = {0, 5, 6, 7};
  r.max_new_tokens = 4;
  r.sampling.temperature = 0;
  auto out = generate(fwd, {r}, GenerateOptions{});
  EXPECT_EQ(out[0].tokens.size(), 4u);
}

// Model::dummy's progress: after each tensor, rising to the model's bytes (a tied head once).
TEST(DummyWeights, ReportProgressUpToTheModelsBytes) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    ModelConfig c = ModelConfig::from_file(model_dir(name) / "config.json");
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    Model m = Model::dummy(c, 1, [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); });
    ASSERT_EQ(calls.size(), m.tensors().size()) << name;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].second, m.weight_bytes()) << name;
      if (i) {
        EXPECT_GT(calls[i].first, calls[i - 1].first) << name;
      }
    }
    EXPECT_EQ(calls.back().first, m.weight_bytes()) << name;
    Model same = Model::dummy(c, 1);  // the callback changes nothing
    EXPECT_EQ(0, std::memcmp(m.weights().embed.data, same.weights().embed.data, m.weights().embed.nbytes()));
  }
}

TEST(Requests, BadRequestsAreExplained) {
  ModelConfig c = ModelConfig::from_file(model_dir("tiny-opt") / "config.json");
  GenerationRequest r;
  EXPECT_NE(error_of([&] { validate_request(r, c); }).find("empty prompt"), std::string::npos);
  r.prompt_ids.assign(size_t(c.max_positions) + 1, 5);
  std::string msg = error_of([&] { validate_request(r, c); });
  EXPECT_NE(msg.find("1025 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_position_embeddings (1024)"), std::string::npos) << msg;
  r.prompt_ids = {2, 4096};
  EXPECT_NE(error_of([&] { validate_request(r, c); }).find("4096"), std::string::npos);
  r.prompt_ids = {2, 5};
  r.sampling.top_p = 0;
  EXPECT_NE(error_of([&] { validate_request(r, c); }).find("top_p"), std::string::npos);
}

TEST(Requests, GenerationStopsAtMaxPositions) {
  Model m = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  GenerationRequest r;
  r.prompt_ids.assign(1020, 262);
  r.prompt_ids[0] = 2;
  r.max_new_tokens = 50;
  r.sampling.temperature = 0;
  GenerateOptions o;
  o.ignore_eos = true;
  auto out = generate(fwd, {r}, o);
  EXPECT_EQ(out[0].tokens.size(), 5u);  // 1020 + 4 fed at positions 0..1023, the 5th drawn from the last
  EXPECT_EQ(out[0].finish, FinishReason::kLength);
}

}  // namespace
}  // namespace flexh2o
