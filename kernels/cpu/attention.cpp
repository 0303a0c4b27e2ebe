// attention(): argument checks and the oneTBB split over (sequence, head, query block).
// With key_scores (tq > 1) the blocks are slot-aligned and each sums its H2O scores into a
// private partial row; partials are added in block order, so the sums are deterministic
// and independent of the thread count and of the batch (see kAttnScoreQB in detail/isa.h).
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/ops.h"

namespace flexh2o::cpu {
namespace detail {
namespace {

// Query heads per decode task: a whole GQA group, so the group's K/V rows come from memory
// once rather than once per head; halved while that would leave fewer than 4 tasks per
// thread. Any choice gives the same bits (AttnTask), so it may depend on the thread count.
int64_t decode_heads_per_task(const AttentionArgs& a) {
  const int64_t want = 4 * int64_t(tbb::this_task_arena::max_concurrency());
  int64_t nh = a.n_heads / a.kv_heads;
  while (nh % 2 == 0 && a.batch * (a.n_heads / nh) < want) nh /= 2;
  return nh;
}

}  // namespace

void attention_isa(Isa isa, const AttentionArgs& a) {
  FH_CHECK(a.batch >= 0 && a.tq >= 0 && a.n_heads > 0 && a.kv_heads > 0 && a.head_dim > 0,
           "attention: bad sizes");
  check_kv_dtype(a.kv_dtype, "attention");
  FH_CHECK(a.n_heads % a.kv_heads == 0, "attention: n_heads ", a.n_heads,
           " is not a multiple of kv_heads ", a.kv_heads);
  FH_CHECK(a.window >= 0, "attention: window must be >= 0, got ", a.window);
  if (a.batch == 0 || a.tq == 0) return;
  FH_CHECK(a.q && a.k && a.v && a.out && a.seq_keys, "attention: null pointer");
  FH_CHECK(a.q_stride >= a.n_heads * a.head_dim && a.out_stride >= a.n_heads * a.head_dim,
           "attention: row stride smaller than n_heads*head_dim");
  int64_t max_keys = 1;
  for (int64_t b = 0; b < a.batch; ++b) {
    FH_CHECK(a.seq_keys[b] >= 0 && a.seq_keys[b] <= a.capacity, "attention: seq_keys[", b, "]=",
             a.seq_keys[b], " outside [0, capacity=", a.capacity, "]");
    max_keys = a.seq_keys[b] > max_keys ? a.seq_keys[b] : max_keys;
  }
  const KernelTable& kt = kernels(isa);
  tbb::enumerable_thread_specific<std::vector<float>> scratch(
      [&] { return std::vector<float>(size_t(attention_scratch_floats(max_keys))); });
  const int64_t BH = a.batch * a.n_heads;

  if (!a.key_scores || a.tq == 1) {  // no cross-query sums (decode: one query per (b, h))
    const int64_t qblocks = (a.tq + kAttnQB - 1) / kAttnQB;
    const int64_t nh = a.tq == 1 ? decode_heads_per_task(a) : 1, hg = a.n_heads / nh;
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, a.batch * hg * qblocks, 1),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        AttnTask t;
                        t.a = &a;
                        t.nh = nh;
                        t.scratch = scratch.local().data();
                        for (int64_t i = r.begin(); i < r.end(); ++i) {
                          const int64_t qb = i % qblocks, bg = i / qblocks;
                          t.b = bg / hg;
                          t.h = bg % hg * nh;
                          t.t0 = qb * kAttnQB;
                          t.t1 = t.t0 + kAttnQB < a.tq ? t.t0 + kAttnQB : a.tq;
                          // One query: 0 + p == p, so adding in place equals the partial path.
                          t.scores = a.key_scores
                                         ? a.key_scores + (t.b * a.n_heads + t.h) * a.capacity
                                         : nullptr;
                          kt.attention_task(t);
                        }
                      });
    return;
  }

  // Key scores over several queries: (b, h, slot block) tasks with partial score rows.
  const int64_t nblk = (a.tq + kAttnScoreQB - 1) / kAttnScoreQB + 1;  // blocks one call can touch
  // Slot range [s0, s1) of block j of sequence b (empty if s0 >= s1); first = slot of row 0.
  auto block = [&](int64_t b, int64_t j, int64_t& s0, int64_t& s1) {
    const int64_t nk = a.seq_keys[b], lo = nk - a.tq > 0 ? nk - a.tq : 0;
    const int64_t blk = lo / kAttnScoreQB + j;
    s0 = blk * kAttnScoreQB > lo ? blk * kAttnScoreQB : lo;
    s1 = (blk + 1) * kAttnScoreQB < nk ? (blk + 1) * kAttnScoreQB : nk;
  };
  std::vector<float> partial(size_t(BH * nblk * max_keys));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, BH * nblk, 1), [&](const tbb::blocked_range<int64_t>& r) {
    AttnTask t;
    t.a = &a;
    t.scratch = scratch.local().data();
    for (int64_t i = r.begin(); i < r.end(); ++i) {
      const int64_t j = i % nblk, bh = i / nblk, b = bh / a.n_heads;
      int64_t s0, s1;
      block(b, j, s0, s1);
      if (s0 >= s1) continue;
      t.b = b;
      t.h = bh % a.n_heads;
      t.t0 = s0 - (a.seq_keys[b] - a.tq);
      t.t1 = s1 - (a.seq_keys[b] - a.tq);
      t.scores = partial.data() + i * max_keys;
      std::fill(t.scores, t.scores + s1, 0.f);
      kt.attention_task(t);
    }
  });
  // Padding rows (negative slot) belong to no block: their outputs are zeros.
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t t = 0; t < a.tq && a.seq_keys[b] - a.tq + t < 0; ++t)
      std::fill(a.out + (b * a.tq + t) * a.out_stride,
                a.out + (b * a.tq + t) * a.out_stride + a.n_heads * a.head_dim, 0.f);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, BH, 1), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t bh = r.begin(); bh < r.end(); ++bh) {
      float* ks = a.key_scores + bh * a.capacity;
      for (int64_t j = 0; j < nblk; ++j) {  // fixed order: blocks in slot order
        int64_t s0, s1;
        block(bh / a.n_heads, j, s0, s1);
        if (s0 >= s1) break;
        const float* p = partial.data() + (bh * nblk + j) * max_keys;
        for (int64_t s = 0; s < s1; ++s) ks[s] += p[s];
      }
    }
  });
}

}  // namespace detail

void attention(const AttentionArgs& a) { detail::attention_isa(detail::best_isa(), a); }

}  // namespace flexh2o::cpu
