// End-to-end checks of the CPU engine against the tiny models' Hugging Face references:
// logits, greedy continuations, perplexity, batching with left padding, weight dtypes, shards;
// and logits of random checkpoints of each architecture against transformers, sliding windows
// decoded past their width among them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "engine/generate.h"
#include "engine/perplexity.h"
#include "loader/safetensors.h"
#include "loader/safetensors_writer.h"
#include "arch_requests.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o {
namespace {
using test::model_dir;
using test::read_json;

class Reference : public ::testing::TestWithParam<std::string> {
 protected:
  static CpuDevice& dev() {
    static CpuDevice d(2);
    return d;
  }
  std::filesystem::path dir() const { return model_dir(GetParam()); }
};

// Runs one unbatched prefill over `ids` and returns logits for every position.
std::vector<float> all_logits(Forward& fwd, const std::vector<int32_t>& ids) {
  KvCache cache(fwd.model().config(), 1, int64_t(ids.size()));
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  std::vector<float> logits;
  fwd.step(ids.data(), pos.data(), int64_t(ids.size()), nullptr, cache, LogitsRows::kAll, logits);
  return logits;
}

void expect_logits_match(const Model& model, CpuDevice& dev, const std::filesystem::path& dir,
                         double tol_fraction) {
  Forward fwd(model, dev);
  const int64_t V = model.config().vocab_size;
  auto ref = read_json(dir / "reference/logits.json");
  for (const auto& p : ref["prompts"]) {
    auto ids = p["ids"].get<std::vector<int32_t>>();
    auto argmax = p["argmax"].get<std::vector<int32_t>>();
    auto last = p["last_logits"].get<std::vector<float>>();
    std::vector<float> logits = all_logits(fwd, ids);
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* row = logits.data() + t * size_t(V);
      EXPECT_EQ(std::max_element(row, row + V) - row, argmax[t]) << p["prompt"] << " position " << t;
    }
    const float* row = logits.data() + (ids.size() - 1) * size_t(V);
    const auto [mn, mx] = std::minmax_element(last.begin(), last.end());
    const double tol = tol_fraction * (*mx - *mn);
    double worst = 0;
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_FALSE(std::isnan(row[v])) << v;
      worst = std::max(worst, std::abs(double(row[v]) - last[size_t(v)]));
    }
    EXPECT_LE(worst, tol) << p["prompt"] << ": max |logit - reference| " << worst;
  }
}

TEST_P(Reference, LogitsMatchHuggingFace) {
  Model model = Model::load_dir(dir());
  expect_logits_match(model, dev(), dir(), 1e-3);
}

TEST_P(Reference, GreedyContinuationsMatchTokenForToken) {
  Model model = Model::load_dir(dir());
  Tokenizer tok = Tokenizer::load(dir());
  Forward fwd(model, dev());
  auto ref = read_json(dir() / "reference/greedy.json");
  for (const auto& p : ref["prompts"]) {
    GenerationRequest r;
    r.prompt_ids = tok.encode(p["prompt"].get<std::string>(), true);
    ASSERT_EQ(r.prompt_ids, p["ids"].get<std::vector<int32_t>>());
    r.max_new_tokens = ref["max_new_tokens"].get<int64_t>();
    r.sampling.temperature = 0;
    GenerateOptions o;
    o.ignore_eos = true;
    auto out = generate(fwd, {r}, o);
    EXPECT_EQ(out[0].tokens, p["generated_ids"].get<std::vector<int32_t>>()) << p["prompt"];
    EXPECT_EQ(tok.decode(out[0].tokens), p["generated_text"].get<std::string>());
    EXPECT_EQ(out[0].finish, FinishReason::kLength);
  }
}

TEST_P(Reference, PerplexityWithinHalfPercent) {
  Model model = Model::load_dir(dir());
  Tokenizer tok = Tokenizer::load(dir());
  Forward fwd(model, dev());
  auto ref = read_json(dir() / "reference/perplexity_full.json");
  auto toks = tok.encode(test::read_text(dir() / "reference/eval.txt"), false);
  ASSERT_EQ(int64_t(toks.size()), ref["eval_txt_total_tokens"].get<int64_t>());
  std::vector<int32_t> ids{ref["bos_token_id"].get<int32_t>()};
  const int64_t n = ref["num_tokens"].get<int64_t>();
  ids.insert(ids.end(), toks.begin(), toks.begin() + n);
  PerplexityResult r = perplexity(fwd, ids, /*chunk=*/300);  // odd chunk: exercises cache reuse
  EXPECT_EQ(r.tokens, n);
  const double want = ref["perplexity"].get<double>();
  EXPECT_NEAR(r.perplexity, want, 0.005 * want);
}

TEST_P(Reference, BatchWithLeftPaddingEqualsEachPromptAlone) {
  Model model = Model::load_dir(dir());
  Tokenizer tok = Tokenizer::load(dir());
  Forward fwd(model, dev());
  const char* prompts[] = {"In the beginning God created", "And", "The LORD is my shepherd; I shall not want.",
                           "Jesus wept.", "And God said, Let there be light: and there was light."};
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r;
    r.prompt_ids = tok.encode(prompts[i], true);
    r.max_new_tokens = 12 + i;  // different lengths: some finish early
    r.sampling.temperature = i % 2 ? 0.f : 0.9f;  // greedy and seeded sampling mixed
    r.sampling.top_k = i == 2 ? 20 : 0;
    r.sampling.top_p = i == 4 ? 0.8f : 1.f;
    r.sampling.seed = 100 + uint64_t(i);
    reqs.push_back(r);
  }
  GenerateOptions batched;
  batched.batch_size = 5;
  batched.eos_ids = model.config().eos_ids;
  GenerateStats st;
  auto together = generate(fwd, reqs, batched, &st);
  EXPECT_EQ(st.batches, 1);
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerateOptions alone = batched;
    alone.batch_size = 1;
    auto single = generate(fwd, {reqs[i]}, alone);
    EXPECT_EQ(single[0].tokens, together[i].tokens) << prompts[i];
    EXPECT_EQ(single[0].finish, together[i].finish) << prompts[i];
  }
  // Batch of 2 with a partial last batch: same again.
  GenerateOptions two = batched;
  two.batch_size = 2;
  auto pairs = generate(fwd, reqs, two);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(pairs[i].tokens, together[i].tokens) << prompts[i];
}

// Rewrites the checkpoint with every tensor converted to `dtype`, optionally in shards.
void rewrite_checkpoint(const std::filesystem::path& src, const std::filesystem::path& dst, DType dtype,
                        int shards) {
  test::copy_model_files(src, dst);
  SafetensorsArchive a = SafetensorsArchive::open_dir(src);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::pair<std::string, TensorView>> all;
  for (const TensorEntry& e : a.tensors()) {
    TensorView v = e.view;
    std::vector<std::byte> b(size_t(v.numel()) * dtype_size(dtype));
    for (int64_t i = 0; i < v.numel(); ++i) {
      float f = v.dtype == DType::F16 ? f16_to_f32(v.as<uint16_t>()[i]) : v.as<float>()[i];
      if (dtype == DType::F32) reinterpret_cast<float*>(b.data())[i] = f;
      if (dtype == DType::BF16) reinterpret_cast<uint16_t*>(b.data())[i] = f32_to_bf16(f);
      if (dtype == DType::F16) reinterpret_cast<uint16_t*>(b.data())[i] = f32_to_f16(f);
    }
    bufs.push_back(std::move(b));
    all.push_back({e.name, TensorView{bufs.back().data(), dtype, v.shape}});
  }
  if (shards <= 1) {
    write_safetensors(dst / "model.safetensors", all);
    return;
  }
  nlohmann::json index{{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (int s = 0; s < shards; ++s) {
    std::vector<std::pair<std::string, TensorView>> part;
    for (size_t i = size_t(s); i < all.size(); i += size_t(shards)) part.push_back(all[i]);
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    write_safetensors(dst / name, part);
    for (const auto& [n, v] : part) index["weight_map"][n] = name;
  }
  std::ofstream(dst / "model.safetensors.index.json") << index.dump(1);
}

TEST_P(Reference, F32AndShardedCheckpointsGiveIdenticalLogits) {
  test::TempDir tmp;
  rewrite_checkpoint(dir(), tmp.path(), DType::F32, 3);
  Model f16 = Model::load_dir(dir());
  Model f32 = Model::load_dir(tmp.path());
  EXPECT_EQ(f32.weights().embed.dtype, DType::F32);
  Forward a(f16, dev()), b(f32, dev());
  auto ids = read_json(dir() / "reference/logits.json")["prompts"][1]["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(all_logits(a, ids), all_logits(b, ids));  // f16 -> f32 is exact
}

TEST_P(Reference, Bf16CheckpointStaysClose) {
  test::TempDir tmp;
  rewrite_checkpoint(dir(), tmp.path(), DType::BF16, 1);
  Model bf16 = Model::load_dir(tmp.path());
  EXPECT_EQ(bf16.weights().layers[0].q_w.dtype, DType::BF16);
  // bf16 keeps 8 mantissa bits: logits move, but the argmax path mostly holds.
  Forward fwd(bf16, dev());
  auto ref = read_json(dir() / "reference/logits.json");
  auto ids = ref["prompts"][0]["ids"].get<std::vector<int32_t>>();
  auto last = ref["prompts"][0]["last_logits"].get<std::vector<float>>();
  auto logits = all_logits(fwd, ids);
  const int64_t V = bf16.config().vocab_size;
  double worst = 0;
  for (int64_t v = 0; v < V; ++v)
    worst = std::max(worst, std::abs(double(logits[size_t((ids.size() - 1) * V + v)]) - last[size_t(v)]));
  EXPECT_LT(worst, 0.5);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, Reference, ::testing::Values("tiny-opt", "tiny-llama"));

// Mistral and Qwen2 checkpoints written by transformers' own classes with random weights, biases
// included (tests/tools/make_arch_models.py): the LLaMA path with Qwen2's q/k/v biases, its tied
// embeddings and rope_theta 1e6, and sliding windows that the 23- and 48-token prompts pass
// (Mistral's and Phi-3's on every layer, Gemma's and Qwen2's on some);
// and each rope scaling type (llama3, yarn, linear, longrope) with prompts reaching its scaled
// region, yarn's and linear's beyond max_position_embeddings; Phi-3's partial rotary and
// Phi-3-mini's head_dim 96; Mixtral's, Qwen2-MoE's, Qwen3-MoE's and OLMoE's experts (Qwen2-MoE's
// with its gated shared expert, OLMoE's q/k norms over the whole projection). A directory is named <model_type>[_<rope
// type> | _partial | _hd<dim> | _window | _mm (the text model of a multimodal checkpoint)].
class ArchReference : public Reference {};

TEST_P(ArchReference, LogitsMatchTransformers) {
  Model model = Model::load_dir(dir());
  const std::string name = dir().filename().string();
  const ModelConfig& c = model.config();
  ASSERT_TRUE(name == c.model_type || name.starts_with(c.model_type + "_")) << name << " is " << c.model_type;
  const std::string variant = name == c.model_type ? "default" : name.substr(c.model_type.size() + 1);
  EXPECT_EQ(c.moe(), c.model_type == "mixtral" || c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe" ||
                         c.model_type == "olmoe");
  if (c.moe()) {
    EXPECT_EQ(c.n_experts, 4);
  }
  if (variant.starts_with("hd"))
    EXPECT_EQ(c.head_dim, std::stoll(variant.substr(2)));
  else if (variant == "mm")  // Gemma 3's text model in a multimodal checkpoint
    EXPECT_TRUE(c.in_multimodal);
  else if (variant == "window")  // some layers slide, others not
    EXPECT_TRUE(c.attention_window(0) == 0 && c.attention_window(1) > 0);
  else if (variant == "partial")
    EXPECT_EQ(model.config().rope.rotary_dims(), model.config().head_dim * 3 / 4);
  else
    EXPECT_EQ(model.config().rope.type, variant);
  expect_logits_match(model, dev(), dir(), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Transformers, ArchReference,
                         ::testing::ValuesIn(std::vector<std::string>(test::arch_models().begin(),
                                                                      test::arch_models().end())),
                         [](const auto& info) { return info.param.substr(5); });

// Sliding windows past their width, one token a step (decode: the window hides slots while
// nothing is evicted): each position's argmax and the last position's logits as transformers
// computes them in one pass over the longest prompt. Where every layer slides, also with the
// `local` policy at the window's width, whose eviction keeps exactly what the window shows.
class WindowDecode : public Reference {};

TEST_P(WindowDecode, StepByStepMatchesTransformersPastTheWindow) {
  Model model = Model::load_dir(dir());
  const ModelConfig& c = model.config();
  const int64_t V = c.vocab_size;
  const auto ref = read_json(dir() / "reference/logits.json");
  const auto& p = ref["prompts"].back();
  const auto ids = p["ids"].get<std::vector<int32_t>>();
  const auto argmax = p["argmax"].get<std::vector<int32_t>>();
  const auto last = p["last_logits"].get<std::vector<float>>();
  const int64_t n = int64_t(ids.size());
  ASSERT_GT(c.sliding_window, 0);
  ASSERT_GT(n, c.sliding_window + 2) << "the prompt must pass the window";
  bool all_slide = true;
  for (int64_t l = 0; l < c.n_layers; ++l) all_slide = all_slide && c.attention_window(l) > 0;
  for (bool evict : {false, true}) {
    if (evict && !all_slide) continue;
    Forward fwd(model, dev());
    KvCache cache(c, 1, n, DType::F32);
    std::unique_ptr<KvPolicy> policy;
    if (evict) {
      KvPolicyConfig pc;
      pc.kind = KvPolicyKind::kLocal;
      pc.recent_budget = c.sliding_window;
      policy = make_policy(pc);
      cache.enable_policy(c, {policy->budget(1)});
    }
    const std::string what = evict ? "local policy" : "full cache";
    std::vector<float> logits;
    for (int64_t t = 0; t < n; ++t) {
      const int32_t pos = int32_t(t);
      fwd.step(&ids[size_t(t)], &pos, 1, nullptr, cache, LogitsRows::kAll, logits, policy.get());
      EXPECT_EQ(std::max_element(logits.begin(), logits.begin() + V) - logits.begin(), argmax[size_t(t)])
          << what << ", position " << t;
    }
    if (evict) {
      EXPECT_EQ(cache.length(0), c.sliding_window - 1) << "the policy kept more than the window";
    }
    const auto [mn, mx] = std::minmax_element(last.begin(), last.end());
    double worst = 0;
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_FALSE(std::isnan(logits[size_t(v)])) << v;
      worst = std::max(worst, std::abs(double(logits[size_t(v)]) - last[size_t(v)]));
    }
    EXPECT_LE(worst, 1e-4 * (*mx - *mn)) << what << ": max |logit - reference| " << worst;
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, WindowDecode,
                         ::testing::Values("arch/mistral", "arch/phi3", "arch/gemma2", "arch/gemma3_text_linear",
                                           "arch/qwen2_window"),
                         [](const auto& info) { return info.param.substr(5); });

}  // namespace
}  // namespace flexh2o
