// In-memory forward: embedding, every layer over the whole-batch KV segment, head.
#include "engine/forward.h"

#include <algorithm>

#include "core/error.h"

namespace flexh2o {

void Forward::step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                   KvCache& cache, LogitsRows rows, std::vector<float>& logits, const KvPolicy* policy,
                   const std::atomic<bool>* stop) {
  const ModelConfig& c = model_.config();
  const ModelWeights& w = *weights_;
  const int64_t B = cache.batch(), M = B * T;
  FH_CHECK(T > 0, "step needs at least one token");
  FH_CHECK(rows.all || (rows.last >= 1 && rows.last <= T), "logits of the last ", rows.last, " rows of a step of ", T);
  for (int64_t i = 0; i < M; ++i) {
    FH_CHECK(positions[i] >= 0 && positions[i] < c.max_positions, "position ", positions[i],
             " outside the model's ", c.max_positions, " positions");
  }
  // Per class of layers (KvCache::layer_class): cached tokens after this step's write.
  const int n_cls = cache.n_classes();
  for (int k = 0; k < n_cls; ++k) {
    std::vector<int32_t>& keys = seq_keys_[size_t(k)];
    keys.resize(size_t(B));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t add = real_rows ? real_rows[b] : T;
      FH_CHECK(add >= 0 && add <= T, "real rows ", add, " outside [0, ", T, "]");
      keys[size_t(b)] = int32_t(cache.length(b, k) + add);
      FH_CHECK(keys[size_t(b)] <= cache.capacity(k), "KV cache full: sequence ", b, " needs ", keys[size_t(b)],
               " slots, capacity ", cache.capacity(k));
    }
    evicted_[size_t(k)] = keys;
  }
  if (hidden_.size() < size_t(M * c.hidden)) hidden_.resize(size_t(M * c.hidden));
  const StepShape shapes[2] = {{B, T, positions, seq_keys_[0].data()},
                               {B, T, positions, n_cls > 1 ? seq_keys_[1].data() : seq_keys_[0].data()}};
  const StepShape& s = shapes[0];
  dev_.run([&] {
    compute_.embed(c, w, ids, s, hidden_.data());
    const bool evict = policy && cache.has_policy();
    const bool prefill = std::all_of(cache.lengths().begin(), cache.lengths().end(), [](int32_t n) { return n == 0; });
    for (int i = 0; i < c.n_layers; ++i) {
      if (stop && stop->load(std::memory_order_relaxed)) throw StepStopped();
      const int k = cache.layer_class(i);
      KvSegment seg = cache.segment(i);
      seg.window = c.attention_window(i);
      if (evict && policy->needs_scores()) {
        scores_.assign(size_t(B * c.n_heads * seg.capacity), 0.f);
        seg.key_scores = scores_.data();
      }
      compute_.layer(c, w.layers[size_t(i)], shapes[k], hidden_.data(), {&seg, 1});
      if (evict) {
        evicted_[size_t(k)] = seq_keys_[size_t(k)];
        EvictArgs ea;
        ea.policy = policy;
        ea.config = &c;
        ea.seg = seg;
        ea.state = cache.state(i);
        ea.len_before = cache.lengths(k).data();
        ea.len_after = evicted_[size_t(k)].data();
        ea.seen_before = cache.seen().data();
        ea.budgets = cache.budgets(k).data();
        ea.prefill = prefill;
        ea.salt = uint64_t(i);
        ea.dirty_lo = &dirty_lo_;
        ea.dirty_hi = &dirty_hi_;
        apply_kv_policy(ea);
      }
    }
    if (rows.all) {
      compute_.head(c, w, s, hidden_.data(), logits);
    } else {
      logits.resize(size_t(rows.last * B * c.vocab_size));
      compute_.head_rows(c, w, s, hidden_.data(), T - rows.last, rows.last, logits.data());
    }
  });
  if (policy && cache.has_policy())
    for (int64_t b = 0; b < B; ++b) cache.seen()[size_t(b)] += seq_keys_[0][size_t(b)] - cache.length(b);
  for (int k = 0; k < n_cls; ++k) cache.lengths(k) = evicted_[size_t(k)];
}

}  // namespace flexh2o
