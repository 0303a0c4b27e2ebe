// decide_kv_policy() (the decision the engine applies to a device-homed cache with kv_gather)
// against apply_kv_policy() (which moves the rows itself), at prefill and decode; a sliding-window
// layer's eviction and the budgets it refuses (check_window_budgets); and the room
// check every device's attend makes before writing K/V (check_kv_room), and the id check every
// device's gather_rows makes before it copies (check_gather_ids).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>

#include "engine/cpu_device.h"
#include "engine/kv_evict.h"
#include "engine/test_util.h"
#include "model/weights.h"
#include "policies/keep_list.h"
#include "policies/kv_policy.h"

namespace flexh2o {
namespace {
using test::model_dir;

// A policy of `kind` with absolute budgets, and a segment of B sequences x the model's KV heads x
// cap slots: K/V rows and H2O scores drawn from g (in that order).
struct RandomSegment {
  std::unique_ptr<KvPolicy> policy;
  std::vector<float> k, v, scores;
};
RandomSegment random_segment(const ModelConfig& c, int64_t B, int64_t cap, KvPolicyKind kind, int64_t heavy,
                             int64_t recent, std::mt19937& g) {
  KvPolicyConfig pc;
  pc.kind = kind;
  pc.heavy_budget = heavy;
  pc.recent_budget = recent;
  RandomSegment r{make_policy(pc), std::vector<float>(size_t(B * c.n_kv_heads * cap * c.head_dim)), {},
                  std::vector<float>(size_t(B * c.n_heads * cap))};
  r.v.resize(r.k.size());
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (auto& x : r.k) x = u(g);
  for (auto& x : r.v) x = u(g);
  for (auto& x : r.scores) x = u(g);
  return r;
}

// A policy run over a random segment, once through apply_kv_policy (moves K/V itself) and once
// through decide_kv_policy with the keep lists applied by the host reference compaction.
void check_decide_equals_apply(bool prefill, KvPolicyKind kind) {
  ModelConfig c = Model::load_dir(model_dir("tiny-llama")).config();  // GQA: 4 heads, 2 KV heads
  const int64_t B = 3, cap = 24, kvh = c.n_kv_heads, hd = c.head_dim;
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  RandomSegment seg = random_segment(c, B, cap, kind, 4, 4, g);
  const auto& policy = seg.policy;
  std::vector<float>&k = seg.k, &v = seg.v, &scores = seg.scores;
  std::vector<int32_t> before = prefill ? std::vector<int32_t>{0, 0, 0} : std::vector<int32_t>{8, 8, 8};
  std::vector<int32_t> after = prefill ? std::vector<int32_t>{20, 5, 13} : std::vector<int32_t>{9, 9, 9};
  std::vector<int32_t> seen = prefill ? std::vector<int32_t>{0, 0, 0} : std::vector<int32_t>{30, 12, 9};
  std::vector<KvBudget> budgets(size_t(B), policy->budget(20));
  KvPolicyState s1, s2;
  s1.reset(B, kvh, cap);
  for (size_t i = 0; i < s1.acc.size(); ++i) s1.acc[i] = u(g), s1.pos[i] = int32_t(i % size_t(cap)) + 100;
  s2 = s1;
  std::vector<float> k2 = k, v2 = v;
  std::vector<int32_t> after2 = after, lo1, hi1, lo2, hi2;
  auto args = [&](float* kk, float* vv, KvPolicyState* st, int32_t* la, std::vector<int32_t>* lo,
                  std::vector<int32_t>* hi) {
    EvictArgs a;
    a.policy = policy.get();
    a.config = &c;
    a.seg = KvSegment{kk, vv, DType::F32, 0, B, cap, scores.data()};
    a.state = st;
    a.len_before = before.data();
    a.len_after = la;
    a.seen_before = seen.data();
    a.budgets = budgets.data();
    a.prefill = prefill;
    a.salt = 3;
    a.dirty_lo = lo;
    a.dirty_hi = hi;
    return a;
  };
  apply_kv_policy(args(k.data(), v.data(), &s1, after.data(), &lo1, &hi1));
  int calls = 0;
  decide_kv_policy(args(nullptr, nullptr, &s2, after2.data(), &lo2, &hi2),
                   [&](int64_t b, int64_t h, std::span<const int32_t> keep) {
                     ++calls;
                     for (size_t i = 0; i < keep.size(); ++i) ASSERT_GE(keep[i], int32_t(i));  // kv_gather's contract
                     for (int64_t d = 0; d < hd; ++d) {  // compact each element column of the row
                       for (std::vector<float>* buf : {&k2, &v2}) {
                         float* row = buf->data() + (b * kvh + h) * cap * hd;
                         std::vector<float> col(static_cast<size_t>(cap));
                         for (int64_t s = 0; s < cap; ++s) col[size_t(s)] = row[s * hd + d];
                         compact_in_place<float>(col, keep);
                         for (int64_t s = 0; s < cap; ++s) row[s * hd + d] = col[size_t(s)];
                       }
                     }
                   });
  EXPECT_GT(calls, 0);
  EXPECT_EQ(k2, k);
  EXPECT_EQ(v2, v);
  EXPECT_EQ(after2, after);
  EXPECT_EQ(s2.acc, s1.acc);
  EXPECT_EQ(s2.pos, s1.pos);
  EXPECT_EQ(lo2, lo1);
  EXPECT_EQ(hi2, hi1);
}

TEST(DecideKvPolicy, KeepListsReproduceApplyAtPrefillAndDecode) {
  for (KvPolicyKind kind : {KvPolicyKind::kH2o, KvPolicyKind::kRandom}) {
    check_decide_equals_apply(true, kind);
    check_decide_equals_apply(false, kind);
  }
}

// A sliding-window layer (window 6) under H2O (2 heavy + 3 recent): the old tokens with the
// highest scores, which the same rows without a window keep as heavy hitters, go because the
// next query cannot see them; every step keeps the full count, all inside the window.
// A segment large enough for decide_kv_policy's parallel path (sequences x heads x slots past its
// threshold) gives what deciding each sequence alone gives: K/V rows, state, lengths, dirty ranges.
TEST(DecideKvPolicy, ParallelSequencesEqualEachSequenceAlone) {
  ModelConfig c = Model::load_dir(model_dir("tiny-llama")).config();
  const int64_t B = 128, cap = 160, kvh = c.n_kv_heads, hd = c.head_dim;
  ASSERT_GT(kv_decision_parallelism(B, kvh, cap), 1) << "below the parallel threshold: the test checks nothing";
  for (KvPolicyKind kind : {KvPolicyKind::kH2o, KvPolicyKind::kRandom}) {
    for (bool prefill : {true, false}) {
      std::mt19937 g(11);
      std::uniform_real_distribution<float> u(0.f, 1.f);
      RandomSegment seg = random_segment(c, B, cap, kind, 40, 30, g);
      const auto& policy = seg.policy;
      std::vector<float>&k = seg.k, &v = seg.v, &scores = seg.scores;
      std::vector<int32_t> before(static_cast<size_t>(B)), after(static_cast<size_t>(B)), seen(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) {
        before[size_t(b)] = prefill ? 0 : 70;
        after[size_t(b)] = prefill ? int32_t(80 + b % 70) : 71;
        seen[size_t(b)] = prefill ? 0 : int32_t(100 + b);
      }
      std::vector<KvBudget> budgets(size_t(B), policy->budget(100));
      KvPolicyState all;
      all.reset(B, kvh, cap);
      for (size_t i = 0; i < all.acc.size(); ++i) all.acc[i] = u(g), all.pos[i] = int32_t(i % size_t(cap));
      KvPolicyState one = all;
      std::vector<float> k1 = k, v1 = v;
      std::vector<int32_t> after1 = after, lo, hi, lo1, hi1;
      EvictArgs a;
      a.policy = policy.get();
      a.config = &c;
      a.seg = KvSegment{k.data(), v.data(), DType::F32, 0, B, cap, scores.data()};
      a.state = &all;
      a.len_before = before.data();
      a.len_after = after.data();
      a.seen_before = seen.data();
      a.budgets = budgets.data();
      a.prefill = prefill;
      a.salt = 5;
      a.dirty_lo = &lo;
      a.dirty_hi = &hi;
      apply_kv_policy(a);
      for (int64_t b = 0; b < B; ++b) {  // one sequence a call: the serial path
        EvictArgs s = a;
        s.seg = KvSegment{k1.data() + b * kvh * cap * hd, v1.data() + b * kvh * cap * hd, DType::F32, 0, 1, cap,
                          scores.data() + b * c.n_heads * cap};
        s.state = &one;
        s.state_first = b;
        s.len_before = before.data() + b;
        s.len_after = after1.data() + b;
        s.seen_before = seen.data() + b;
        s.budgets = budgets.data() + b;
        std::vector<int32_t> l, h;
        s.dirty_lo = &l, s.dirty_hi = &h;
        apply_kv_policy(s);
        lo1.insert(lo1.end(), l.begin(), l.end());
        hi1.insert(hi1.end(), h.begin(), h.end());
      }
      const std::string what = std::string(kv_policy_name(kind)) + (prefill ? " prefill" : " decode");
      EXPECT_EQ(after, after1) << what;
      EXPECT_LT(after[0], 80) << what << ": nothing was evicted";
      EXPECT_EQ(lo, lo1) << what;
      EXPECT_EQ(hi, hi1) << what;
      EXPECT_EQ(all.acc, one.acc) << what;
      EXPECT_EQ(all.pos, one.pos) << what;
      EXPECT_TRUE(k == k1 && v == v1) << what << ": K/V rows differ";
    }
  }
}

TEST(DecideKvPolicy, SlidingWindowLayerKeepsOnlyItsWindow) {
  ModelConfig c = Model::load_dir(model_dir("tiny-llama")).config();
  const int64_t cap = 16, kvh = c.n_kv_heads, W = 6;
  KvPolicyConfig pc;
  pc.kind = KvPolicyKind::kH2o;
  pc.heavy_budget = 2;
  pc.recent_budget = 3;
  auto policy = make_policy(pc);
  const KvBudget budget = policy->budget(12);
  for (int64_t window : {int64_t(0), W}) {
    KvPolicyState st;
    st.reset(1, kvh, cap);
    std::vector<float> scores(size_t(c.n_heads * cap));
    for (int64_t h = 0; h < c.n_heads; ++h)
      for (int64_t s = 0; s < 12; ++s) scores[size_t(h * cap + s)] = s < 4 ? 10.f + float(s) : 0.01f * float(s);
    int32_t before = 0, after = 12, seen = 0;
    std::vector<int32_t> lo, hi;
    for (int step = 0; step < 5; ++step) {
      EvictArgs a;
      a.policy = policy.get();
      a.config = &c;
      a.seg = KvSegment{nullptr, nullptr, DType::F32, 0, 1, cap, scores.data()};
      a.seg.window = window;
      a.state = &st;
      a.len_before = &before;
      a.len_after = &after;
      a.seen_before = &seen;
      a.budgets = &budget;
      a.prefill = step == 0;
      a.salt = 1;
      a.dirty_lo = &lo;
      a.dirty_hi = &hi;
      const int32_t added = after - before, newest = seen + added - 1;
      decide_kv_policy(a, [](int64_t, int64_t, std::span<const int32_t>) {});
      ASSERT_EQ(after, budget.total() - 1) << "step " << step;
      for (int64_t h = 0; h < kvh; ++h) {
        const int32_t* pos = st.pos.data() + h * cap;
        const int32_t oldest = *std::min_element(pos, pos + after);
        if (window)
          EXPECT_GE(oldest, newest - W + 2) << "step " << step << ": a position the next query cannot see was kept";
        else
          EXPECT_EQ(oldest, 2) << "without a window, the old heavy hitters stay";  // scores 12 and 13
      }
      seen += added;
      before = after;  // the next step appends one token
      after = before + 1;
      std::fill(scores.begin(), scores.end(), 0.f);
    }
  }
}

TEST(WindowBudgets, ABudgetAboveTheWindowIsRefusedOnlyWhenSequencesPassIt) {
  ModelConfig c = Model::load_dir(model_dir("tiny-llama")).config();
  const std::vector<KvBudget> fits = {{0, 3, 3, false}}, over = {{0, 4, 3, false}}, full = {{0, 0, 0, true}};
  EXPECT_NO_THROW(check_window_budgets(c, over, 100));  // no sliding layer
  c.sliding_window = 6;
  c.sliding_layers.assign(size_t(c.n_layers), 1);
  EXPECT_NO_THROW(check_window_budgets(c, fits, 100));
  EXPECT_NO_THROW(check_window_budgets(c, full, 100));
  EXPECT_NO_THROW(check_window_budgets(c, over, 6));  // never beyond the window
  try {
    check_window_budgets(c, over, 7);
    ADD_FAILURE() << "a 7-token budget over a 6-token window was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV budget of 7 tokens (sequence 0) is more than the 6-token sliding window"),
              std::string::npos)
        << e.what();
  }
  const std::vector<int64_t> prompt{9};
  EXPECT_THROW(
      try { check_window_budgets(c, over, 7, prompt); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("KV budget of 7 tokens (of a sequence whose budget's basis is 9 tokens)"),
                  std::string::npos)
            << e.what();
        throw;
      },
      Error);
}

// The full cache becomes `local` at the window's width only where every layer slides and the
// sequences pass the window; a policy the user chose, a model without a window, or one with a
// full-attention layer keeps what it asked for.
TEST(WindowKvPolicy, OnlyTheFullCacheOfAnAllSlidingModelPastItsWindowIsCapped) {
  ModelConfig c = Model::load_dir(model_dir("tiny-llama")).config();
  const KvPolicyConfig full;
  EXPECT_EQ(window_kv_policy(c, full, 1000), full);  // no sliding layer
  c.sliding_window = 6;
  c.sliding_layers.assign(size_t(c.n_layers), 1);
  EXPECT_EQ(window_kv_policy(c, full, 6), full) << "never past the window";
  EXPECT_FALSE(window_caps_full_cache(c, 6));
  const KvPolicyConfig capped = window_kv_policy(c, full, 7);
  EXPECT_TRUE(window_caps_full_cache(c, 7));
  EXPECT_EQ(capped.kind, KvPolicyKind::kLocal);
  EXPECT_EQ(capped.recent_budget, 6);
  EXPECT_FALSE(capped.recent_ratio || capped.heavy_budget || capped.heavy_ratio || capped.sink_tokens);
  EXPECT_EQ(make_policy(capped)->budget(100).total(), 6) << "the window's positions, the incoming token included";
  EXPECT_NO_THROW(check_window_budgets(c, std::vector<KvBudget>{make_policy(capped)->budget(100)}, 1000));
  KvPolicyConfig h2o;
  h2o.kind = KvPolicyKind::kH2o;
  h2o.heavy_budget = 2;
  h2o.recent_budget = 2;
  EXPECT_EQ(window_kv_policy(c, h2o, 1000), h2o);
  c.sliding_layers.back() = 0;  // one full-attention layer needs every token
  EXPECT_EQ(window_kv_policy(c, full, 1000), full);
  EXPECT_FALSE(window_caps_full_cache(c, 1000));
}

// A segment of sequences 2..3 of a micro-batch with capacity 8: their keys are read from index
// first_seq on, a full sequence is refused by name, and others' keys are not its concern.
TEST(KvRoom, ASequencePastItsSegmentsCapacityIsRefused) {
  const KvSegment seg{nullptr, nullptr, DType::F16, 2, 2, 8, nullptr};
  const int32_t fits[] = {99, 99, 8, 1, 99};
  EXPECT_NO_THROW(check_kv_room(fits, seg));
  const int32_t full[] = {0, 0, 3, 9, 0};
  try {
    check_kv_room(full, seg);
    ADD_FAILURE() << "a sequence needing 9 slots of 8 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache full: sequence needs 9 slots, capacity 8"), std::string::npos)
        << e.what();
  }
}

}  // namespace
// The first and last rows pass; -1, table_rows and a missing id array are refused by name, and
// the CPU device refuses before copying anything.
TEST(GatherIds, RowsOutsideTheTableAreRefusedBeforeAnyCopy) {
  const int32_t edge[] = {0, 6, 3};
  EXPECT_NO_THROW(check_gather_ids(edge, 3, 7));
  EXPECT_NO_THROW(check_gather_ids(nullptr, 0, 7));
  for (int32_t bad : {-1, 7}) {
    const int32_t ids[] = {2, bad};
    try {
      check_gather_ids(ids, 2, 7);
      ADD_FAILURE() << "row " << bad << " of a 7-row table was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gather_rows: row " + std::to_string(bad) + " outside [0, 7)"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(check_gather_ids(nullptr, 1, 7), Error);

  CpuDevice dev(1);
  const std::vector<float> table = {1, 2, 3, 4, 5, 6};  // 3 rows of 2
  std::vector<float> out(4, -7.f);
  const int32_t ids[] = {2, 3};
  EXPECT_THROW(dev.gather_rows(Queue::kHostToDevice, out.data(), table.data(), 3, 2 * sizeof(float), ids, ids, 2),
               Error);
  dev.synchronize();
  for (float v : out) EXPECT_EQ(v, -7.f);  // the good first row was not copied either
  const int32_t good[] = {2, 0};
  dev.gather_rows(Queue::kHostToDevice, out.data(), table.data(), 3, 2 * sizeof(float), good, good, 2);
  dev.synchronize();
  EXPECT_EQ(out, (std::vector<float>{5, 6, 1, 2}));
}

}  // namespace flexh2o
