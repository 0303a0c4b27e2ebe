// Mixtures of experts (model_type mixtral, qwen2_moe, qwen3_moe, olmoe) at the config and loading level: each
// family's keys and defaults, the refusals, the weight specs (router and experts, all in the MLP
// unit), LayerWeights::all() reaching every expert, and errors naming a missing expert tensor.
// Their logits against transformers: reference_test.cpp; offloaded and compressed: offload_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>

#include "core/error.h"
#include "loader/safetensors.h"
#include "loader/safetensors_writer.h"
#include "model/weights.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;

using test::error_of;

nlohmann::json config_of(const char* model) { return test::read_json(model_dir(model) / "config.json"); }
ModelConfig parse(const nlohmann::json& j) { return ModelConfig::from_json_text(j.dump(), "c"); }

TEST(MoeConfig, EachFamilysKeysAndDefaults) {
  nlohmann::json j = config_of("arch/mixtral");
  ModelConfig c = parse(j);
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.experts_per_token, 2);
  EXPECT_TRUE(c.norm_topk_prob);  // Mixtral always renormalizes
  EXPECT_EQ(c.ffn_dim, 64);       // intermediate_size is an expert's
  EXPECT_FALSE(c.qk_norm || c.mlp_bias);
  j.erase("num_local_experts"), j.erase("num_experts_per_tok");
  c = parse(j);  // MixtralConfig's defaults
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.experts_per_token, 2);

  j = config_of("arch/qwen3_moe");
  c = parse(j);
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.ffn_dim, 48);  // moe_intermediate_size, not intermediate_size (64)
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_TRUE(c.qk_norm);
  j.erase("num_local_experts");
  j["num_experts"] = 6;  // the key the published Qwen3-MoE configs use
  j["norm_topk_prob"] = true;
  c = parse(j);
  EXPECT_EQ(c.n_experts, 6);
  EXPECT_TRUE(c.norm_topk_prob);
  j.erase("num_experts"), j.erase("num_experts_per_tok"), j.erase("moe_intermediate_size"), j.erase("norm_topk_prob");
  c = parse(j);  // Qwen3MoeConfig's defaults
  EXPECT_EQ(c.n_experts, 128);
  EXPECT_EQ(c.experts_per_token, 8);
  EXPECT_EQ(c.ffn_dim, 768);
  EXPECT_FALSE(c.norm_topk_prob);
  // Qwen2-MoE: q/k/v biases (qkv_bias) and the shared expert.
  j = config_of("arch/qwen2_moe");
  c = parse(j);
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.ffn_dim, 48);
  EXPECT_EQ(c.shared_expert_dim, 80);
  EXPECT_EQ(c.ffn_scratch_dim(), 80);
  EXPECT_TRUE(c.norm_topk_prob && c.attention_bias && !c.o_bias && !c.qk_norm);
  j["qkv_bias"] = false;
  EXPECT_FALSE(parse(j).attention_bias);
  for (const char* k : {"qkv_bias", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "shared_expert_intermediate_size", "norm_topk_prob"})
    j.erase(k);
  c = parse(j);  // Qwen2MoeConfig's defaults
  EXPECT_EQ(c.n_experts, 60);
  EXPECT_EQ(c.experts_per_token, 4);
  EXPECT_EQ(c.ffn_dim, 1408);
  EXPECT_EQ(c.shared_expert_dim, 5632);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.norm_topk_prob);
  // OLMoE: q/k norms over the whole projection ([q_dim], [kv_dim]), intermediate_size an expert's.
  j = config_of("arch/olmoe");
  c = parse(j);
  EXPECT_TRUE(c.qk_norm && c.qk_norm_whole);
  EXPECT_EQ(c.ffn_dim, 32);
  EXPECT_FALSE(c.norm_topk_prob);
  for (const WeightSpec& s : weight_specs(c))
    if (s.name.ends_with("self_attn.q_norm.weight") || s.name.ends_with("self_attn.k_norm.weight")) {
      EXPECT_EQ(s.shape, (Shape{128})) << s.name;  // 2 heads (and 2 KV heads) of 64
    }
  j.erase("num_experts"), j.erase("num_experts_per_tok");
  c = parse(j);  // OlmoeConfig's defaults
  EXPECT_EQ(c.n_experts, 64);
  EXPECT_EQ(c.experts_per_token, 8);
  j["clip_qkv"] = 8.0;
  EXPECT_NE(error_of([&] { parse(j); }).find("clip_qkv (clamping q, k and v) is not supported, got 8"),
            std::string::npos);
  // A dense model has none of it.
  EXPECT_FALSE(parse(config_of("arch/qwen3")).moe());
  EXPECT_FALSE(parse(config_of("arch/qwen3")).qk_norm_whole);
  EXPECT_EQ(parse(config_of("arch/qwen3")).shared_expert_dim, 0);
}

TEST(MoeConfig, RefusesWhatItCannotRun) {
  nlohmann::json j = config_of("arch/mixtral");
  j["num_experts_per_tok"] = 5;
  EXPECT_NE(error_of([&] { parse(j); }).find("num_experts_per_tok (5) exceeds the 4 experts"), std::string::npos);
  j["num_experts_per_tok"] = 0;
  EXPECT_NE(error_of([&] { parse(j); }).find("num_experts_per_tok"), std::string::npos);
  j["num_experts_per_tok"] = 2;
  j["num_local_experts"] = 1025;  // beyond what the CUDA routing kernel takes
  EXPECT_NE(error_of([&] { parse(j); }).find("num_local_experts"), std::string::npos);
  j = config_of("arch/qwen3_moe");
  j["decoder_sparse_step"] = 2;
  EXPECT_NE(error_of([&] { parse(j); }).find("decoder_sparse_step other than 1"), std::string::npos);
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = {1};
  EXPECT_NE(
      error_of([&] { parse(j); }).find("mlp_only_layers (dense layers among the MoE ones) is not supported, got [1]"),
      std::string::npos);
  j["mlp_only_layers"] = nullptr;
  EXPECT_NO_THROW(parse(j));
  j["moe_intermediate_size"] = -4;
  EXPECT_NE(error_of([&] { parse(j); }).find("moe_intermediate_size"), std::string::npos);
}

TEST(MoeWeights, SpecsHoldTheRouterAndEveryExpertInTheMlpUnit) {
  for (const char* name : {"arch/mixtral", "arch/qwen3_moe"}) {
    const ModelConfig c = parse(config_of(name));
    const bool mixtral = c.model_type == "mixtral";
    const std::string p = std::string("model.layers.1.") + (mixtral ? "block_sparse_moe." : "mlp.");
    int router = 0, experts = 0;
    for (const WeightSpec& s : weight_specs(c)) {
      if (s.layer != 1) continue;
      EXPECT_FALSE(s.name.starts_with("model.layers.1.mlp.gate_proj")) << s.name;  // no dense MLP
      if (s.name == p + "gate.weight") {
        ++router;
        EXPECT_EQ(s.shape, (Shape{4, 64}));
        EXPECT_EQ(s.part, LayerPart::kMlp);
      } else if (s.name.starts_with(p + "experts.")) {
        ++experts;
        EXPECT_EQ(s.part, LayerPart::kMlp) << s.name;
        const bool down = s.name.ends_with(mixtral ? ".w2.weight" : ".down_proj.weight");
        EXPECT_EQ(s.shape, down ? (Shape{64, c.ffn_dim}) : (Shape{c.ffn_dim, 64})) << s.name;
      } else {
        EXPECT_EQ(s.name.find(".mlp."), std::string::npos) << s.name;
      }
    }
    EXPECT_EQ(router, 1) << name;
    EXPECT_EQ(experts, 12) << name;
  }
  // Qwen2-MoE's shared expert and its [1, hidden] gate, in the MLP unit too.
  const ModelConfig c = parse(config_of("arch/qwen2_moe"));
  std::map<std::string, Shape> shared;
  for (const WeightSpec& s : weight_specs(c))
    if (s.layer == 1 && s.name.find("shared_expert") != std::string::npos) {
      EXPECT_EQ(s.part, LayerPart::kMlp) << s.name;
      shared[s.name.substr(s.name.find("shared_expert"))] = s.shape;
    }
  EXPECT_EQ(shared, (std::map<std::string, Shape>{{"shared_expert.down_proj.weight", Shape{64, 80}},
                                                  {"shared_expert.gate_proj.weight", Shape{80, 64}},
                                                  {"shared_expert.up_proj.weight", Shape{80, 64}},
                                                  {"shared_expert_gate.weight", Shape{1, 64}}}));
  const Model m = Model::load_dir(model_dir("arch/qwen2_moe"));
  const LayerWeights& L = m.weights().layers[0];
  EXPECT_EQ(L.shared_expert.down_w.shape, (Shape{64, 80}));
  EXPECT_EQ(L.shared_gate_w.shape, (Shape{1, 64}));
  EXPECT_TRUE(L.gate_w.empty());           // not mistaken for a dense MLP's gate_proj
  EXPECT_EQ(m.parameter_count(), 171456);  // transformers' count
}

TEST(MoeWeights, LoadedExpertsAreTheCheckpointsAndAllReachesThem) {
  const Model m = Model::load_dir(model_dir("arch/mixtral"));
  EXPECT_EQ(m.parameter_count(), 164672);  // transformers' count for the checkpoint
  SafetensorsArchive a = SafetensorsArchive::open_dir(model_dir("arch/mixtral"));
  const LayerWeights& L = m.weights().layers[1];
  ASSERT_EQ(L.experts.size(), 4u);
  auto same = [&](const TensorView& v, const std::string& name) {  // the bytes of the stored tensor
    const TensorEntry* e = a.find("model.layers.1.block_sparse_moe." + name);
    return e && e->view.nbytes() == v.nbytes() && std::memcmp(e->view.data, v.data, v.nbytes()) == 0;
  };
  EXPECT_TRUE(same(L.router_w, "gate.weight"));
  EXPECT_TRUE(same(L.experts[3].gate_w, "experts.3.w1.weight"));
  EXPECT_TRUE(same(L.experts[3].up_w, "experts.3.w3.weight"));
  EXPECT_TRUE(same(L.experts[3].down_w, "experts.3.w2.weight"));
  EXPECT_FALSE(same(L.experts[2].gate_w, "experts.3.w1.weight"));
  EXPECT_TRUE(L.gate_w.empty() && L.up_w.empty() && L.down_w.empty());
  // all(): what compression, offload remapping and hazard tracking visit.
  size_t bound = 0;
  for (const TensorView* v : L.all()) bound += !v->empty();
  EXPECT_EQ(bound, 2u + 4u + 1u + 12u);  // 2 norms, q/k/v/o, the router, 4 experts of 3
  EXPECT_EQ(Model::load_dir(model_dir("arch/qwen3_moe")).parameter_count(), 140352);
}

TEST(MoeWeights, AMissingExpertTensorIsNamed) {
  test::TempDir tmp;
  test::copy_model_files(model_dir("arch/mixtral"), tmp.path());
  SafetensorsArchive a = SafetensorsArchive::open_dir(model_dir("arch/mixtral"));
  std::vector<std::pair<std::string, TensorView>> t;
  for (const auto& e : a.tensors())
    if (e.name != "model.layers.1.block_sparse_moe.experts.2.w3.weight") t.push_back({e.name, e.view});
  write_safetensors(tmp.path() / "model.safetensors", t);
  const std::string msg = error_of([&] { Model::load_dir(tmp.path()); });
  EXPECT_NE(msg.find("\"model.layers.1.block_sparse_moe.experts.2.w3.weight\" is missing"), std::string::npos) << msg;
}

}  // namespace
}  // namespace flexh2o
