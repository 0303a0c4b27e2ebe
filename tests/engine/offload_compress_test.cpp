// 4-bit compression (issue #12) in the offloading engine on the CPU device: placement holds
// every 2-D weight as Q4 records on every tier (bytes from the one formula), the memory plan
// sizes Q4 KV rows, the disk store's identity includes compression (a store built one way is
// rebuilt, not reused, the other way), and offloaded runs with W4 / KV4 / W4+KV4 give the
// in-memory compressed run's logits bit for bit over a grid of placements and KV policies (and
// the hazard-checking device finds every access ordered).
#include <gtest/gtest.h>

#include <set>

#include <sstream>

#include "bible_requests.h"
#include "core/quant4.h"
#include "engine/compress.h"
#include "engine/cpu_device.h"
#include "engine/offload_engine.h"
#include "policy_of.h"
#include "runner_compare.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;

TEST(CompressPlacement, EveryTwoDimensionalWeightIsQ4OnEveryTier) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    Model m = Model::load_dir(model_dir(name));
    Policy p = test::policy_of("30 30 100 0 100 0", 2, 2);
    const WeightPlacement plain = place_weights(m, p);
    p.compress_weight = true;
    const WeightPlacement q = place_weights(m, p);
    ASSERT_EQ(q.units.size(), plain.units.size());
    size_t n2d = 0, plain_bytes = 0, q_bytes = 0;
    for (size_t u = 0; u < q.units.size(); ++u) {
      ASSERT_EQ(q.units[u].tensors.size(), plain.units[u].tensors.size());
      for (size_t i = 0; i < q.units[u].tensors.size(); ++i) {
        const PlacedTensor& t = q.units[u].tensors[i];
        plain_bytes += plain.units[u].tensors[i].bytes;
        q_bytes += t.bytes;
        if (t.source.shape.ndim == 2) {
          ++n2d;
          EXPECT_EQ(t.dtype, DType::Q4) << t.name;
          EXPECT_EQ(t.bytes, q4::tensor_bytes(t.source.shape[0], t.source.shape[1])) << t.name;
        } else {
          EXPECT_EQ(t.dtype, t.source.dtype) << t.name;
          EXPECT_EQ(t.bytes, t.source.nbytes()) << t.name;
        }
      }
    }
    EXPECT_GT(n2d, 4u) << name;
    // f16 weights with 64-wide groups: 36 bytes per 64 values instead of 128 (1-D tensors stay).
    EXPECT_LT(double(q_bytes), 0.30 * double(plain_bytes)) << name;
    EXPECT_GT(double(q_bytes), 0.28 * double(plain_bytes)) << name;
    size_t homed = 0;
    for (size_t t = 0; t < 3; ++t) homed += q.bytes[t];
    EXPECT_EQ(homed, q_bytes) << name;
  }
}

TEST(CompressPlacement, CompressedWeightsAreTheEnginesEncoding) {
  Model m = Model::load_dir(model_dir("tiny-llama"));
  const CompressedWeights cw(m);
  const ModelWeights& w = cw.weights();
  EXPECT_EQ(w.embed.dtype, DType::Q4);
  EXPECT_EQ(w.layers[0].q_w.dtype, DType::Q4);
  EXPECT_EQ(w.layers[0].ln1_w.dtype, m.weights().layers[0].ln1_w.dtype);  // 1-D stays
  EXPECT_EQ(w.layers[0].ln1_w.data, m.weights().layers[0].ln1_w.data);
  // Each record decodes within the header's bound of the checkpoint's values.
  const TensorView src = m.weights().layers[0].down_w, q = w.layers[0].down_w;
  const int64_t rows = src.shape[0], cols = src.shape[1];
  std::vector<float> dec(size_t(rows * cols)), ref(size_t(rows * cols));
  q4::decode_rows(q.data, rows, cols, dec.data(), cols);
  // The bytes are the scalar reference's (the engine encodes in parallel, convert_tensor).
  std::vector<std::byte> ref_bytes(held_bytes(src, DType::Q4));
  ASSERT_TRUE(src.dtype == DType::F16 || src.dtype == DType::BF16);
  if (src.dtype == DType::F16) q4::encode_rows_f16(src.as<uint16_t>(), cols, rows, cols, ref_bytes.data(), "down_w");
  else q4::encode_rows_bf16(src.as<uint16_t>(), cols, rows, cols, ref_bytes.data(), "down_w");
  EXPECT_EQ(std::memcmp(ref_bytes.data(), q.data, ref_bytes.size()), 0);
  convert_tensor(src, DType::F32, ref.data(), "down_w");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < q4::groups(cols); ++g) {
      float mn = INFINITY, mx = -INFINITY;
      const int64_t a = g * q4::kGroup, z = std::min(cols, a + q4::kGroup);
      for (int64_t i = a; i < z; ++i) mn = std::min(mn, ref[size_t(r * cols + i)]), mx = std::max(mx, ref[size_t(r * cols + i)]);
      // d/2 + |mn - f16(mn)| + fp16 rounding of d: (mx - mn) / 15 covers it generously at 0.6x.
      const float bound = (mx - mn) / 15 * 0.6f + std::abs(mn) * 1e-3f + 1e-6f;
      for (int64_t i = a; i < z; ++i)
        ASSERT_LE(std::abs(dec[size_t(r * cols + i)] - ref[size_t(r * cols + i)]), bound) << r << "," << i;
    }
}

TEST(CompressMemoryPlan, KvRowsAreQ4Records) {
  Model m = Model::load_dir(model_dir("tiny-opt"));
  const ModelConfig& c = m.config();
  const Policy p = test::policy_of("100 0 0 50 100 0", 2, 2);
  BatchDims d;
  d.rows = 9;
  d.capacity = 17;
  const WeightBytes w = WeightBytes::of(place_weights(m, p));
  const MemoryPlan f16 = plan_memory(c, w, p, d, {DeviceKind::kCpu, DType::F16, DType::F32});
  const MemoryPlan q = plan_memory(c, w, p, d, {DeviceKind::kCpu, DType::Q4, DType::F32});
  const uint64_t row = q4::row_bytes(c.head_dim);
  EXPECT_EQ(q.kv_home_seq, 2 * uint64_t(c.n_kv_heads) * row * uint64_t(q.cap_h));
  EXPECT_EQ(q.kv_device_seq, 2 * uint64_t(c.n_kv_heads) * row * uint64_t(q.cap_w));
  EXPECT_LT(q.kv_home_seq * 3, f16.kv_home_seq);
  // Disk homes are packed like host homes, so 4-bit KV shrinks them as much; only the host
  // staging of one micro-batch's disk rows rounds up to whole 4096-byte pages.
  auto item = [](const MemoryPlan& m, Tier t, const std::string& what) {
    for (const MemoryItem& i : m.items)
      if (i.tier == t && i.what == what) return i.bytes;
    return uint64_t(0);
  };
  const int64_t nk = q.split.n_disk;
  ASSERT_GT(nk, 0);
  for (const MemoryPlan* m : {&f16, &q}) {
    EXPECT_EQ(item(*m, Tier::kDisk, "KV homed"), uint64_t(p.num_gpu_batches * nk * c.n_layers) * m->kv_home_seq);
    EXPECT_EQ(item(*m, Tier::kHost, "KV disk staging"), 2 * kv_disk_stage_bytes(nk, m->kv_home_seq));
  }
  EXPECT_LT(item(q, Tier::kDisk, "KV homed") * 3, item(f16, Tier::kDisk, "KV homed"));
  EXPECT_EQ(kv_disk_stage_bytes(3, 4096 + 36), 3u * 4096 + 4096);
  EXPECT_EQ(kv_disk_stage_bytes(2, 2048), 4096u);
  EXPECT_EQ(kv_disk_stage_bytes(0, 2048), 0u);
}

// Every weight on disk, half the KV on disk.
OffloadOptions disk_options(const std::filesystem::path& dir, bool compress) {
  OffloadOptions o;
  o.policy = test::policy_of("0 0 0 50 100 0", 2, 2);
  o.policy.compress_weight = compress;
  o.offload_dir = dir;
  return o;
}

TEST(CompressStore, CompressionIsPartOfTheStoreIdentity) {
  Model m = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  test::TempDir dir;
  std::vector<std::string> notes;
  auto opts = [&](bool compress) {
    OffloadOptions o = disk_options(dir.path() / "store", compress);
    o.notice = [&](const std::string& s) { notes.push_back(s); };
    return o;
  };
  size_t plain_written = 0;
  {
    OffloadEngine e(m, dev, opts(false));
    plain_written = e.report().weights_written;
    EXPECT_GT(plain_written, 0u);
  }
  uint64_t q_disk = 0;
  {  // compressed: nothing of the plain store is reused
    OffloadEngine e(m, dev, opts(true));
    EXPECT_EQ(e.report().weights_reused, 0u);
    EXPECT_EQ(e.report().weights_written, plain_written);
    q_disk = e.placement().bytes[2];
  }
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes.back().find("compress_weight"), std::string::npos) << notes.back();
  {  // compressed again: every file reused
    OffloadEngine e(m, dev, opts(true));
    EXPECT_EQ(e.report().weights_written, 0u);
    EXPECT_EQ(e.report().weights_reused, plain_written);
  }
  {  // and back: the run-1 files of the 2-D weights (another name: w.<name>.F16) are still this
     // identity's, but every 1-D file the compressed runs rewrote is refused and rebuilt.
    OffloadEngine e(m, dev, opts(false));
    size_t n2d = 0, n = 0;
    std::set<const void*> files;  // a tied lm_head reads the embedding's file
    for (const UnitPlacement& u : e.placement().units)
      for (const PlacedTensor& t : u.tensors)
        if (files.insert(t.source.data).second) n2d += t.source.shape.ndim == 2, ++n;
    EXPECT_EQ(e.report().weights_reused, n2d);
    EXPECT_EQ(e.report().weights_written, n - n2d);
    EXPECT_GT(e.placement().bytes[2], 3 * q_disk);
  }
}

// ---- offloaded compressed runs against the in-memory compressed run ---------------------------

struct Case {
  const char* model;
  const char* percent;  // "w_g w_c c_g c_c a_g a_c"
  int gbs, ngb;
  bool cpu_attention = false;
  bool w4 = true, kv4 = true;
  KvPolicyKind kv = KvPolicyKind::kFull;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.model << " [" << c.percent << "] " << c.gbs << "x" << c.ngb << (c.cpu_attention ? " cpu-attn" : "")
            << (c.w4 ? " W4" : "") << (c.kv4 ? " KV4" : "") << " " << kv_policy_name(c.kv);
}

std::unique_ptr<KvPolicy> kv_policy(KvPolicyKind kind) {
  if (kind == KvPolicyKind::kFull) return nullptr;
  KvPolicyConfig k;
  k.kind = kind;
  k.heavy_budget = 4;
  k.recent_budget = 3;
  return make_policy(k);
}

std::vector<GenerationRequest> requests(const std::string& model) {
  std::vector<GenerationRequest> reqs = test::bible_requests(model, 6);
  const auto more = test::bible_requests(model, 8);
  reqs.insert(reqs.end(), more.begin(), more.begin() + 2);
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].max_new_tokens = 5 + int64_t(i % 3);
  return reqs;
}

class CompressGrid : public ::testing::TestWithParam<Case> {};

TEST_P(CompressGrid, LogitsBitIdenticalToInMemoryCompressed) {
  const Case& c = GetParam();
  Model model = Model::load_dir(model_dir(c.model));
  CpuDevice dev(2);
  const auto policy = kv_policy(c.kv);
  const auto reqs = requests(c.model);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = test::policy_of(c.percent, c.gbs, c.ngb, c.cpu_attention);
  o.policy.compress_weight = c.w4;
  o.policy.compress_cache = c.kv4;
  o.offload_dir = dir.path() / "store";
  o.kv_policy = policy.get();
  OffloadEngine eng(model, dev, o);
  EXPECT_EQ(eng.options().kv_dtype, c.kv4 ? DType::Q4 : DType::F16);
  std::optional<CompressedWeights> cw;
  Forward fwd(model, dev);
  if (c.w4) fwd.use_weights(&cw.emplace(model).weights());
  InMemoryRunner ref(fwd, eng.max_batch(), policy.get(), c.kv4 ? DType::Q4 : DType::F16);
  std::ostringstream what;
  what << c;
  const test::Run got = test::run_greedy(eng, reqs);
  test::expect_same_logits(got, test::run_greedy(ref, reqs), what.str());
  EXPECT_EQ(eng.report().weight_dtype, c.w4 ? "Q4" : "F16");
  // Compression took effect: the uncompressed run's prefill logits differ.
  Forward plain_fwd(model, dev);
  InMemoryRunner plain(plain_fwd, eng.max_batch(), policy.get(), DType::F16);
  const test::Run base = test::run_greedy(plain, reqs);
  EXPECT_NE(base.logits.at(0), got.logits.at(0)) << what.str();
}

using K = KvPolicyKind;
INSTANTIATE_TEST_SUITE_P(
    Placements, CompressGrid,
    ::testing::Values(Case{"tiny-opt", "100 0 100 0 100 0", 2, 2}, Case{"tiny-opt", "0 100 0 100 0 100", 3, 2},
                      Case{"tiny-opt", "0 100 0 100 0 100", 3, 2, false, true, false},
                      Case{"tiny-opt", "0 100 0 100 0 100", 3, 2, false, false, true},
                      Case{"tiny-opt", "20 30 34 33 0 100", 3, 2, true},
                      Case{"tiny-opt", "0 0 0 0 100 0", 2, 2, true},
                      Case{"tiny-opt", "30 30 34 33 0 100", 3, 2, false, true, true, K::kH2o},
                      Case{"tiny-opt", "30 30 34 33 0 100", 3, 2, true, true, true, K::kH2o},
                      Case{"tiny-opt", "0 0 0 50 100 0", 2, 2, true, false, true, K::kH2o},
                      Case{"tiny-llama", "50 0 34 33 100 0", 2, 3}, Case{"tiny-llama", "0 0 0 100 0 100", 3, 2, true},
                      Case{"tiny-llama", "0 100 0 0 0 100", 3, 2, true, true, true, K::kH2o}));

// The hazard-checking device over compressed runs: every access (sized by Q4 records) is ordered
// after its writer by the schedule, with weights and KV on every tier and H2O.
TEST(CompressHazards, TheScheduleCoversEveryAccess) {
  for (const Case& c : {Case{"tiny-opt", "20 30 34 33 0 100", 3, 2, true, true, true, K::kH2o},
                        Case{"tiny-llama", "0 50 0 50 0 100", 2, 3, true}}) {
    Model model = Model::load_dir(model_dir(c.model));
    CpuDeviceOptions co;
    co.threads = 2, co.check_hazards = true, co.max_delay_us = 200;
    CpuDevice dev(co);
    const auto policy = kv_policy(c.kv);
    test::TempDir dir;
    OffloadOptions o;
    o.policy = test::policy_of(c.percent, c.gbs, c.ngb, c.cpu_attention);
    o.policy.compress_weight = c.w4;
    o.policy.compress_cache = c.kv4;
    o.offload_dir = dir.path();
    o.kv_policy = policy.get();
    OffloadEngine eng(model, dev, o);
    auto reqs = requests(c.model);
    reqs.resize(4);
    EXPECT_NO_THROW(test::run_greedy(eng, reqs)) << c;
  }
}

}  // namespace
}  // namespace flexh2o
