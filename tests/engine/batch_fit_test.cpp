// StepRunner::check_batch on the offloading engine against what its batches really allocate: at
// the smallest budget check_batch accepts the batch runs, one byte less and the batch's own
// allocation fails too (the check refuses no run that would fit, and lets none through that
// would not), per tier, over placements, KV policies and partial blocks; and generate() refuses a
// run whose later batch does not fit before it produces any result.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "engine/cpu_device.h"
#include "engine/forwarding_runner.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "policies/kv_policy.h"
#include "policy_of.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;

std::vector<GenerationRequest> requests(std::initializer_list<std::pair<int64_t, int64_t>> prompt_and_gen,
                                        int32_t token = 262) {
  std::vector<GenerationRequest> reqs;
  for (auto [n, gen] : prompt_and_gen) {
    GenerationRequest r;
    r.prompt_ids.assign(size_t(n), token);
    r.prompt_ids[0] = 2;
    r.max_new_tokens = gen;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  return reqs;
}

// The engine without its check: only the batch's allocations decide.
class Unchecked final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  void check_batch(std::span<const int64_t>, int64_t, int64_t) const override {}
};

struct Case {
  const char* percent;
  int64_t gbs, ngb;
  bool cpu_attention;
  const char* kv;  // "full" or "h2o" (ratios 0.25 + 0.25)
  int tier;        // the budget under test (the other tiers unbounded): 0 device, 1 host, 2 disk
  size_t batch = 5;  // sequences (at most the block)
  bool continuous = false;  // one continuous batch (its refills attend on the device)
};

std::unique_ptr<KvPolicy> kv_policy(const char* kv) {
  if (std::string(kv) == "full") return nullptr;
  KvPolicyConfig c;
  c.kind = KvPolicyKind::kH2o;
  c.heavy_ratio = 0.25;
  c.recent_ratio = 0.25;
  return make_policy(c);
}

class BatchFit : public ::testing::TestWithParam<Case> {};

TEST_P(BatchFit, TheCheckedBudgetIsTheOneTheBatchAllocates) {
  const Case& k = GetParam();
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  const std::unique_ptr<KvPolicy> kv = kv_policy(k.kv);
  // One batch: a block of gbs x ngb or less (its last micro-batch partial where gbs does not
  // divide it).
  std::vector<GenerationRequest> reqs = requests({{5, 7}, {9, 3}, {2, 9}, {7, 1}, {3, 4}, {6, 2}, {8, 5}});
  std::vector<int64_t> lengths = {5, 9, 2, 7, 3, 6, 8};
  const size_t B = std::min<size_t>(k.batch, size_t(k.gbs * k.ngb));
  reqs.resize(B);
  lengths.resize(B);
  const int64_t rows = *std::max_element(lengths.begin(), lengths.end()), capacity = rows + 9;
  test::TempDir dir;
  auto options = [&](uint64_t budget) {
    OffloadOptions o;
    o.policy = test::policy_of(k.percent, k.gbs, k.ngb, k.cpu_attention);
    o.kv_policy = kv.get();
    o.offload_dir = dir.path();
    (k.tier == 0 ? o.device_mem : k.tier == 1 ? o.host_mem : o.disk_mem) = budget;
    return o;
  };
  auto accepted = [&](uint64_t budget) {
    try {
      OffloadEngine eng(model, dev, options(budget));
      eng.check_batch(lengths, rows, capacity);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  uint64_t lo = 1, hi = 256ull << 20;  // lo refused, hi accepted
  ASSERT_TRUE(accepted(hi));
  ASSERT_FALSE(accepted(lo));
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (accepted(mid) ? hi : lo) = mid;
  }
  GenerateOptions go;
  go.ignore_eos = true;
  go.continuous = k.continuous;
  {
    OffloadEngine eng(model, dev, options(hi));
    Unchecked run(eng);
    EXPECT_NO_THROW(generate(run, reqs, go)) << "refused at " << hi << " bytes, which the batch fits";
  }
  try {
    OffloadEngine eng(model, dev, options(lo));  // may itself refuse: the smallest run does not fit
    Unchecked run(eng);
    EXPECT_THROW(generate(run, reqs, go), Error) << "accepted at " << lo << " bytes, which the batch does not fit";
  } catch (const Error&) {
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, BatchFit,
                         ::testing::Values(Case{"100 0 100 0 100 0", 2, 3, false, "full", 0},
                                           Case{"20 80 50 50 100 0", 2, 2, false, "full", 0},
                                           Case{"20 80 50 50 100 0", 2, 2, false, "full", 1},
                                           Case{"0 100 0 100 0 100", 4, 2, true, "full", 1},
                                           Case{"0 100 0 100 100 0", 3, 1, false, "h2o", 0},
                                           Case{"0 100 0 100 0 100", 2, 3, true, "h2o", 1},
                                           Case{"100 0 100 0 100 0", 8, 1, false, "h2o", 0},
                                           Case{"0 100 0 0 100 0", 2, 3, false, "full", 2},
                                           Case{"0 100 50 0 100 0", 2, 3, true, "h2o", 2},
                                           Case{"0 100 0 50 0 100", 4, 2, true, "h2o", 1},
                                           // Floors put more on disk in the partial micro-batch: of
                                           // 4, 1 + 1 + 2; of 3, 0 + 0 + 3 (its host staging is larger).
                                           Case{"0 100 25 25 100 0", 4, 2, false, "full", 1, 7},
                                           Case{"0 100 25 25 0 100", 4, 2, true, "h2o", 1, 7},
                                           // One continuous batch of every request (no refill: the
                                           // batch's own sizing, and host attention's two slots).
                                           Case{"20 80 0 100 100 0", 2, 3, true, "full", 0, 5, true},
                                           Case{"20 80 0 100 100 0", 2, 3, true, "full", 1, 5, true},
                                           Case{"0 100 0 50 0 100", 4, 2, true, "full", 1, 7, true},
                                           Case{"0 100 0 100 0 100", 2, 3, true, "h2o", 1, 5, true},
                                           Case{"100 0 100 0 100 0", 2, 2, false, "full", 0, 4, true}));

// Two batches, the second longer: without the check its prefill fails after the first batch's
// results were handed out; with it generate() refuses before any.
// check_batch weighs each batch's KV files against the disk's free space alone, so a batch's
// files must be gone before the next batch creates its own (a full disk at the second batch,
// found by a user on a small tmpfs, where the check had passed).
TEST(BatchFit, ANewBatchRemovesTheLastBatchsKvFilesFirst) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = test::policy_of("100 0 0 0 100 0", 2, 2, false);
  o.offload_dir = dir.path();
  OffloadEngine eng(model, dev, o);
  auto kv_files = [&] {
    int n = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir.path()))
      n += f.path().filename().string().rfind("kv.", 0) == 0;
    return n;
  };
  std::vector<float> logits;
  const std::vector<int32_t> ids(12, 262), pos = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2};
  eng.begin_batch(4, 8);
  eng.step(ids.data(), pos.data(), 3, nullptr, logits);
  EXPECT_EQ(kv_files(), 2 * model.config().n_layers);  // a file a layer and micro-batch
  eng.begin_batch(3, 20);
  EXPECT_EQ(kv_files(), 0);
  eng.step(ids.data(), pos.data(), 3, nullptr, logits);
  EXPECT_EQ(kv_files(), 2 * model.config().n_layers);
}

TEST(BatchFit, GenerateRefusesBeforeTheFirstResult) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  std::vector<GenerationRequest> reqs = requests({{3, 1}, {3, 1}, {40, 60}, {40, 60}});
  OffloadOptions o;
  o.policy = test::policy_of("100 0 100 0 100 0", 2, 1);
  o.device_mem = 64ull << 20;
  uint64_t first = 0;  // the first batch's need: found as the smallest budget it is accepted at
  for (uint64_t b = 1ull << 20; b < o.device_mem; b += 4096) {
    OffloadOptions t = o;
    t.device_mem = b;
    try {
      OffloadEngine eng(model, dev, t);
      eng.check_batch(std::vector<int64_t>{3, 3}, 3, 4);
      first = b;
      break;
    } catch (const Error&) {
    }
  }
  ASSERT_GT(first, 0u);
  o.device_mem = first;
  OffloadEngine eng(model, dev, o);
  int results = 0;
  GenerateOptions go;
  go.ignore_eos = true;
  go.on_result = [&](size_t, const GenerationResult&) { ++results; };
  {
    Unchecked unchecked(eng);
    EXPECT_THROW(generate(unchecked, reqs, go), Error);
    EXPECT_EQ(results, 2);  // what a run without the check lost with its output
  }
  results = 0;
  const std::string refused = test::error_of([&] { generate(eng, reqs, go); });
  EXPECT_NE(refused.find("too small for a batch of this run (2 sequences, prompt 40"), std::string::npos) << refused;
  EXPECT_EQ(results, 0);
}

// --continuous on a runner that rewinds runs one batch sized for every request; the static
// batches it would fall back to (here one with a capacity of 300 + 500) are not what it needs.
TEST(BatchFit, AContinuousRunIsCheckedAsTheBatchItRuns) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  const std::vector<GenerationRequest> reqs = requests({{10, 10}, {10, 10}, {10, 500}, {300, 1}});
  OffloadOptions o;
  o.policy = test::policy_of("100 0 100 0 100 0", 2, 1);
  uint64_t lo = 1, hi = 256ull << 20;  // the continuous batch (2 slots, rows 300, room for 510)
  auto fits = [&](uint64_t b) {
    OffloadOptions t = o;
    t.device_mem = b;
    try {
      OffloadEngine eng(model, dev, t);
      eng.check_batch(std::vector<int64_t>{10, 10}, 300, 510);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? hi : lo) = mid;
  }
  o.device_mem = hi;
  OffloadEngine eng(model, dev, o);
  GenerateOptions go;
  go.ignore_eos = true;
  go.continuous = true;
  GenerateStats st;
  EXPECT_NO_THROW(generate(eng, reqs, go, &st));
  EXPECT_TRUE(st.continuous);
  go.continuous = false;  // as static batches the second needs more
  EXPECT_THROW(check_batches(eng, reqs, go), Error);
}

// --continuous on a runner that cannot rewind (here a window cap: the full cache of a model with
// a sliding layer) runs its first batch as wide as its own prompts and the rest as static
// batches: checked as those, not as one batch as wide as the longest prompt (which refused runs
// that fit), and a later batch that does not fit is found before the first result.
TEST(BatchFit, AContinuousRunThatCannotRewindIsCheckedAsTheBatchesItRuns) {
  Model model = Model::load_dir(model_dir("arch/qwen2_window"));  // window 20
  CpuDevice dev(2);
  const std::vector<GenerationRequest> reqs = requests({{3, 100}, {3, 100}, {100, 1}, {100, 1}}, 5);
  OffloadOptions o;
  o.policy = test::policy_of("0 100 100 0 100 0", 2, 1);
  GenerateOptions go;
  go.ignore_eos = true;
  go.continuous = true;
  auto smallest = [&](const std::function<void(OffloadEngine&)>& check) {
    uint64_t lo = 1, hi = 256ull << 20;
    while (hi - lo > 1) {
      const uint64_t mid = lo + (hi - lo) / 2;
      OffloadOptions t = o;
      t.device_mem = mid;
      OffloadEngine eng(model, dev, t);
      bool fits = true;
      try {
        check(eng);
      } catch (const Error&) {
        fits = false;
      }
      (fits ? hi : lo) = mid;
    }
    return hi;
  };
  const uint64_t need = smallest([&](OffloadEngine& eng) { check_batches(eng, reqs, go); });
  GenerateOptions plain = go;
  plain.continuous = false;
  EXPECT_EQ(need, smallest([&](OffloadEngine& eng) { check_batches(eng, reqs, plain); }));
  o.device_mem = need;
  {
    OffloadEngine eng(model, dev, o);
    EXPECT_FALSE(eng.rewinds(203));
    Unchecked run(eng);
    GenerateStats st;
    EXPECT_NO_THROW(generate(run, reqs, go, &st)) << "refused at " << need << " bytes, which its batches fit";
    EXPECT_FALSE(st.continuous);
  }
  // The first batch alone fits less: the second (prompts of 100) is what needs `need`.
  const uint64_t first = smallest([&](OffloadEngine& eng) {
    check_batches(eng, std::vector<GenerationRequest>(reqs.begin(), reqs.begin() + 2), go);
  });
  ASSERT_LT(first, need);
  o.device_mem = first;
  OffloadEngine eng(model, dev, o);
  int results = 0;
  go.on_result = [&](size_t, const GenerationResult&) { ++results; };
  EXPECT_NE(test::error_of([&] { generate(eng, reqs, go); }).find("too small for a batch of this run"),
            std::string::npos);
  EXPECT_EQ(results, 0);
}

// A KV budget that grows with the prompt (ratios) passes a sliding window in a later, longer
// batch: refused before the first batch's results, as the prefill would refuse it.
TEST(BatchFit, ABudgetPastTheSlidingWindowInALaterBatchIsFoundFirst) {
  Model model = Model::load_dir(model_dir("arch/mistral"));  // window 20
  CpuDevice dev(2);
  KvPolicyConfig kc;
  kc.kind = KvPolicyKind::kH2o;
  kc.heavy_ratio = 0.4;
  kc.recent_ratio = 0.4;
  const std::unique_ptr<KvPolicy> kv = make_policy(kc);
  OffloadOptions o;
  o.policy = test::policy_of("100 0 100 0 100 0", 2, 1);
  o.kv_policy = kv.get();
  OffloadEngine eng(model, dev, o);
  int results = 0;
  GenerateOptions go;
  go.ignore_eos = true;
  go.on_result = [&](size_t, const GenerationResult&) { ++results; };
  const std::string refused =
      test::error_of([&] { generate(eng, requests({{10, 30}, {10, 30}, {60, 30}, {60, 30}}, 5), go); });
  EXPECT_NE(refused.find("KV budget of 48 tokens (of a sequence whose budget's basis is 60 tokens) is more than "
                         "the 20-token"),
            std::string::npos)
      << refused;
  EXPECT_EQ(results, 0);
  EXPECT_NO_THROW(generate(eng, requests({{10, 30}, {10, 30}}, 5), go));  // the first batch alone runs
  EXPECT_EQ(results, 2);
}

// The sizes refusals print: 3 significant digits, and never a float's exponent ("1.01e+03 MiB").
TEST(BatchFit, SizesAreSaidInWholeUnits) {
  EXPECT_EQ(human_bytes(1010ull << 20), "1010 MiB");
  EXPECT_EQ(human_bytes(1023ull << 30), "1023 GiB");
  EXPECT_EQ(human_bytes(8944640), "8.53 MiB");
  EXPECT_EQ(human_bytes(6ull << 20), "6 MiB");
  EXPECT_EQ(human_bytes(999), "999 B");
  EXPECT_EQ(human_bytes(92364ull << 10), "90.2 MiB");
}

// A refused batch says how many of its sequences fit, and that number is the largest the check
// accepts: K sequences pass check_batch, K + 1 are refused. Under a budget one sequence exceeds,
// it says so instead of naming a batch.
TEST(BatchFit, RefusalNamesTheLargestBatchThatFits) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  const std::vector<int64_t> eight(8, 200);
  for (const uint64_t host_mb : {5, 7, 9}) {
    OffloadOptions o;
    o.policy = test::policy_of("100 0 0 100 100 0", 3, 3);  // the KV cache on the host
    o.host_mem = host_mb << 20;
    OffloadEngine eng(model, dev, o);
    const std::string refused = test::error_of([&] { eng.check_batch(eight, 200, 300); });
    const size_t at = refused.find("at most ");
    ASSERT_NE(at, std::string::npos) << refused;
    const int64_t k = std::stoll(refused.substr(at + 8));
    ASSERT_GE(k, 1) << refused;
    ASSERT_LT(k, 8) << refused;
    EXPECT_NE(refused.find(" of these 8 sequences fit these budgets (e.g. --gpu-batch-size "), std::string::npos);
    const int64_t g = std::min<int64_t>(k, 3);
    EXPECT_NE(refused.find(detail::concat("--gpu-batch-size ", g, " --num-gpu-batches ", k / g, ", a block of ",
                                          g * (k / g), ")")),
              std::string::npos)
        << refused;
    EXPECT_NO_THROW(eng.check_batch(std::vector<int64_t>(size_t(k), 200), 200, 300)) << k << " sequences";
    EXPECT_THROW(eng.check_batch(std::vector<int64_t>(size_t(k + 1), 200), 200, 300), Error) << k + 1;
  }
  OffloadOptions o;
  o.policy = test::policy_of("100 0 0 100 100 0", 3, 3);
  o.host_mem = 256 << 10;
  OffloadEngine eng(model, dev, o);
  const std::string refused = test::error_of([&] { eng.check_batch(eight, 200, 300); });
  EXPECT_NE(refused.find("not even one sequence of this length fits these budgets"), std::string::npos) << refused;
  EXPECT_EQ(refused.find("at most "), std::string::npos) << refused;
}

}  // namespace
}  // namespace flexh2o
