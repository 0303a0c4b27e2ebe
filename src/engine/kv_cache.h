// In-memory KV cache of one batch of sequences, all layers, left-aligned, in a KV dtype
// (f32 / f16 / bf16, or Q4: each slot row one record of row_nbytes(Q4, head_dim) bytes).
// Layout per layer: K and V each [batch, kv_heads, capacity, head_dim]; sequence b's tokens
// fill slots [0, length(b)) — left padding never enters the cache.
// Owns its memory; move-only; not thread-safe (one batch is driven by one thread).
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "engine/kv_evict.h"
#include "engine/layer_compute.h"
#include "model/config.h"

namespace flexh2o {

class KvCache {
 public:
  KvCache(const ModelConfig& c, int64_t batch, int64_t capacity, DType dtype = DType::F32)
      : batch_(batch), capacity_(capacity), dtype_(dtype), lengths_(size_t(batch), 0) {
    FH_CHECK(batch > 0 && capacity > 0, "KV cache needs batch > 0 and capacity > 0");
    FH_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::Q4,
             "KV cache dtype must be F32, F16, BF16 or Q4");
    const size_t per_layer = size_t(batch * c.n_kv_heads * capacity) * row_nbytes(dtype, c.head_dim);
    k_.assign(size_t(c.n_layers), std::vector<std::byte>(per_layer));
    v_.assign(size_t(c.n_layers), std::vector<std::byte>(per_layer));
  }
  // With a policy: per-layer scores/positions, per-sequence budgets and tokens seen.
  void enable_policy(const ModelConfig& c, std::vector<KvBudget> budgets) {
    state_.resize(k_.size());
    for (auto& s : state_) s.reset(batch_, c.n_kv_heads, capacity_);
    budgets_ = std::move(budgets);
    seen_.assign(size_t(batch_), 0);
  }
  bool has_policy() const { return !state_.empty(); }
  KvPolicyState& state(int layer) { return state_[size_t(layer)]; }
  const std::vector<KvBudget>& budgets() const { return budgets_; }
  std::vector<int32_t>& seen() { return seen_; }
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  DType dtype() const { return dtype_; }
  // Tokens cached for sequence b.
  int64_t length(int64_t b) const { return lengths_[size_t(b)]; }
  std::vector<int32_t>& lengths() { return lengths_; }
  // The whole batch as one segment of layer `layer`.
  KvSegment segment(int layer) {
    return KvSegment{k_[size_t(layer)].data(), v_[size_t(layer)].data(), dtype_, 0, batch_, capacity_};
  }
  size_t bytes() const {
    size_t n = k_.size() * 2 * k_[0].size();
    for (const auto& s : state_) n += s.bytes();
    return n;
  }

 private:
  int64_t batch_, capacity_;
  DType dtype_;
  std::vector<int32_t> lengths_;
  std::vector<std::vector<std::byte>> k_, v_;
  std::vector<KvPolicyState> state_;
  std::vector<KvBudget> budgets_;
  std::vector<int32_t> seen_;
};

}  // namespace flexh2o
