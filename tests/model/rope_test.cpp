// Rope parsing (model/rope.h) against transformers: every rope type's inverse frequencies and
// attention factor for published settings (tests/data/rope/cases.json, written by
// tests/tools/make_rope_cases.py), the positions each type allows exactly, and refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

json cases() {
  std::ifstream in(fs::path(FLEXH2O_TEST_DATA) / "rope" / "cases.json");
  return json::parse(in);
}

const json& case_config(const json& all, const std::string& name) {
  for (const json& c : all["cases"])
    if (c["name"] == name) return c["config"];
  throw std::runtime_error("no rope case " + name);
}

std::string error_of(const json& config) {
  try {
    ModelConfig::from_json_text(config.dump(), "c.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// transformers computes in float32 (a pow of the base to up to 1 in float32: relative error
// ~1e-6); we compute in double.
TEST(Rope, FrequenciesMatchTransformers) {
  const json all = cases();
  ASSERT_GE(all["cases"].size(), 10u);
  for (const json& k : all["cases"]) {
    const std::string name = k["name"];
    const ModelConfig c = ModelConfig::from_json_text(k["config"].dump(), name);
    EXPECT_EQ(c.rope.type, k["rope_type"].get<std::string>()) << name;
    const auto want = k["inv_freq"].get<std::vector<double>>();
    ASSERT_EQ(c.rope.inv_freq.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(c.rope.inv_freq[i], want[i], 4e-6 * want[i]) << name << " pair " << i;
    EXPECT_NEAR(c.rope.attention_factor, k["attention_factor"].get<double>(), 1e-6) << name;
  }
}

// A case whose frequencies equal the default rope's would pass the test above with a parser that
// ignores the scaling; each scaled case must differ from the default somewhere.
TEST(Rope, ScaledCasesDifferFromDefault) {
  for (const json& k : cases()["cases"]) {
    if (k["rope_type"] == "default" || k["rope_type"] == "dynamic") continue;
    json plain = k["config"];
    plain.erase("rope_scaling");
    plain.erase("rope_parameters");
    if (k["config"].contains("rope_parameters")) plain["rope_theta"] = k["config"]["rope_parameters"]["rope_theta"];
    const ModelConfig d = ModelConfig::from_json_text(plain.dump(), "plain");
    const auto want = k["inv_freq"].get<std::vector<double>>();
    double most = std::abs(k["attention_factor"].get<double>() - 1);
    for (size_t i = 0; i < want.size(); ++i) most = std::max(most, std::abs(want[i] - d.rope.inv_freq[i]) / want[i]);
    EXPECT_GT(most, 1e-3) << k["name"];
  }
}

TEST(Rope, PositionsEachTypeAllows) {
  const json all = cases();
  auto positions = [&](const std::string& name) {
    return ModelConfig::from_json_text(case_config(all, name).dump(), name).max_positions;
  };
  EXPECT_EQ(positions("llama-3.1"), 131072);         // llama3: max_position_embeddings already extended
  EXPECT_EQ(positions("linear-vicuna-16k"), 16384);  // linear: 4096 x 4
  EXPECT_EQ(positions("dynamic"), 4096);             // beyond, transformers changes the frequencies
  EXPECT_EQ(positions("yarn-qwen2.5"), 131072);      // yarn: 32768 x 4
  EXPECT_EQ(positions("yarn-mscale"), 163840);       // 4096 x 40
  EXPECT_EQ(positions("longrope-phi3"), 4096);       // beyond, transformers switches to long_factor
  EXPECT_EQ(positions("longrope-factor"), 8192);
  EXPECT_EQ(positions("default"), 2048);
  // A sliding window does not cap the positions (Mistral with YaRN): its layers attend to the
  // window past it.
  json m = case_config(all, "yarn-qwen2.5");
  m["model_type"] = "mistral";
  m["sliding_window"] = 4096;
  const ModelConfig mc = ModelConfig::from_json_text(m.dump(), "m");
  EXPECT_EQ(mc.max_positions, 131072);
  EXPECT_EQ(mc.attention_window(0), 4096);
}

TEST(Rope, OldAndNewSpellingsAgree) {
  const json all = cases();
  json old_style = case_config(all, "llama-3.1");
  json new_style = old_style;
  new_style.erase("rope_theta");
  new_style.erase("rope_scaling");
  new_style["rope_parameters"] = old_style["rope_scaling"];
  new_style["rope_parameters"]["rope_theta"] = 500000.0;
  const ModelConfig a = ModelConfig::from_json_text(old_style.dump(), "a");
  const ModelConfig b = ModelConfig::from_json_text(new_style.dump(), "b");
  EXPECT_EQ(a.rope.inv_freq, b.rope.inv_freq);
  // rope_scaling wins over rope_parameters, as in transformers; an empty one counts as absent.
  new_style["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(ModelConfig::from_json_text(new_style.dump(), "c").rope.type, "linear");
  new_style["rope_scaling"] = json::object();
  EXPECT_EQ(ModelConfig::from_json_text(new_style.dump(), "d").rope.inv_freq, a.rope.inv_freq);
  new_style["rope_scaling"] = nullptr;
  EXPECT_EQ(ModelConfig::from_json_text(new_style.dump(), "e").rope.inv_freq, a.rope.inv_freq);
}

TEST(Rope, BadSettingsAreRefusedByName) {
  const json all = cases();
  const json l3 = case_config(all, "llama-3.1");
  auto edit = [&](const json& base, const char* key, const json& value) {
    json j = base;
    if (value.is_null())
      j["rope_scaling"].erase(key);
    else
      j["rope_scaling"][key] = value;
    return error_of(j);
  };
  EXPECT_HAS(edit(l3, "rope_type", "mrope"), "rope_type \"mrope\"; supported: default, linear, dynamic, llama3");
  EXPECT_HAS(edit(l3, "factor", nullptr), "c.json rope_scaling: required key \"factor\" is missing");
  EXPECT_HAS(edit(l3, "factor", 0), "\"factor\" must be positive, got 0");
  EXPECT_HAS(edit(l3, "factor", "8"), "\"factor\" must be a finite number");
  EXPECT_HAS(edit(l3, "low_freq_factor", nullptr), "required key \"low_freq_factor\" is missing");
  EXPECT_HAS(edit(l3, "high_freq_factor", 1.0),
             "\"high_freq_factor\" (1) must be greater than \"low_freq_factor\" (1)");
  EXPECT_HAS(edit(l3, "original_max_position_embeddings", -3),
             "\"original_max_position_embeddings\" must be an integer");
  EXPECT_HAS(edit(l3, "partial_rotary_factor", 0.5), "partial_rotary_factor 0.5 is not supported (phi3 only");
  EXPECT_HAS(edit(l3, "rope_theta", -1.0), "\"rope_theta\" must be positive");
  json nested = l3;
  nested["rope_scaling"] = {{"full_attention", {{"rope_type", "default"}}}};
  EXPECT_HAS(error_of(nested), "per-layer rope parameters");
  nested["rope_scaling"] = json::array({1, 2});
  EXPECT_HAS(error_of(nested), "\"rope_scaling\" must be an object");
  const json lr = case_config(all, "longrope-phi3");
  EXPECT_HAS(edit(lr, "short_factor", json::array({1.0, 2.0})), "\"short_factor\" must be a list of 48 numbers");
  json zero = lr["rope_scaling"]["long_factor"];
  zero[3] = 0;
  EXPECT_HAS(edit(lr, "long_factor", zero), "\"long_factor\" must hold positive finite numbers, got 0");
  EXPECT_HAS(edit(lr, "long_factor", nullptr), "required key \"long_factor\" is missing");
  const json yarn = case_config(all, "yarn-qwen2.5");
  EXPECT_HAS(edit(yarn, "truncate", 1), "\"truncate\" must be true or false");
  EXPECT_HAS(edit(yarn, "attention_factor", -0.5), "\"attention_factor\" must be positive");
  EXPECT_HAS(edit(yarn, "beta_fast", -4), "\"beta_fast\" must be positive");
  EXPECT_HAS(edit(yarn, "rope_theta", 1.0), "yarn needs \"rope_theta\" above 1");
  json neg = yarn;
  neg["rope_scaling"]["mscale"] = 1.0;
  neg["rope_scaling"]["mscale_all_dim"] = -20.0;  // its mscale is negative: so is the factor
  EXPECT_HAS(error_of(neg), "these yarn rope settings give an attention factor of -");
  json one = lr;
  one["original_max_position_embeddings"] = 1;  // log(1) divides the attention factor
  EXPECT_HAS(error_of(one), "longrope needs \"original_max_position_embeddings\" of 2 or more");
  json odd = case_config(all, "default");
  odd["head_dim"] = 7;
  EXPECT_HAS(error_of(odd), "the rotary dimensions (head_dim 7 x partial_rotary_factor 1 = 7) must be even");
}

}  // namespace
}  // namespace flexh2o
