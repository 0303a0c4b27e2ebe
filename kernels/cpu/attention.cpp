// attention(): argument checks and the oneTBB split over (sequence, head[, query block]).
// Query blocks are split across tasks only when key_scores is null: H2O score sums are
// accumulated by one task per (sequence, head), in query order, so they are deterministic.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <vector>

#include "core/error.h"
#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/ops.h"

namespace flexh2o::cpu {
namespace detail {

void attention_isa(Isa isa, const AttentionArgs& a) {
  FH_CHECK(a.batch >= 0 && a.tq >= 0 && a.n_heads > 0 && a.kv_heads > 0 && a.head_dim > 0,
           "attention: bad sizes");
  FH_CHECK(a.n_heads % a.kv_heads == 0, "attention: n_heads ", a.n_heads,
           " is not a multiple of kv_heads ", a.kv_heads);
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
  const int64_t qblocks = a.key_scores ? 1 : (a.tq + kAttnQB - 1) / kAttnQB;
  const int64_t per_block = a.key_scores ? a.tq : kAttnQB;
  const int64_t ntasks = a.batch * a.n_heads * qblocks;
  tbb::enumerable_thread_specific<std::vector<float>> scratch(
      [&] { return std::vector<float>(size_t(attention_scratch_floats(max_keys))); });
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, ntasks, 1), [&](const tbb::blocked_range<int64_t>& r) {
    AttnTask t;
    t.a = &a;
    t.scratch = scratch.local().data();
    for (int64_t i = r.begin(); i < r.end(); ++i) {
      const int64_t qb = i % qblocks, bh = i / qblocks;
      t.b = bh / a.n_heads;
      t.h = bh % a.n_heads;
      t.t0 = qb * per_block;
      t.t1 = t.t0 + per_block < a.tq ? t.t0 + per_block : a.tq;
      kt.attention_task(t);
    }
  });
}

}  // namespace detail

void attention(const AttentionArgs& a) { detail::attention_isa(detail::best_isa(), a); }

}  // namespace flexh2o::cpu
