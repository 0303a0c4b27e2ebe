// In-memory KV cache of one batch of sequences, all layers, left-aligned, in a KV dtype
// (f32 / f16 / bf16, or Q4: each slot row one record of row_nbytes(Q4, head_dim) bytes).
// Layout per layer: K and V each [batch, kv_heads, capacity, head_dim]; sequence b's tokens
// fill slots [0, length(b)) — left padding never enters the cache. Under a window cap the
// sliding layers are a class of their own, with fewer slots and their own lengths.
// Owns its memory; move-only; not thread-safe (one batch is driven by one thread).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "engine/kv_evict.h"
#include "engine/layer_compute.h"
#include "model/config.h"

namespace flexh2o {

class KvCache {
 public:
  // window_capacity > 0: a window cap (full_cache_window()) of a model whose other layers attend
  // to everything: its sliding layers form class 1, with window_capacity slots and lengths of
  // their own; the other layers are class 0 (`capacity` slots). Without one, or when every layer
  // slides, one class holds every layer.
  KvCache(const ModelConfig& c, int64_t batch, int64_t capacity, DType dtype = DType::F32, int64_t window_capacity = 0)
      : batch_(batch), dtype_(dtype), class_(size_t(c.n_layers), 0) {
    FH_CHECK(batch > 0 && capacity > 0 && window_capacity >= 0, "KV cache needs batch > 0 and capacity > 0");
    FH_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::Q4,
             "KV cache dtype must be F32, F16, BF16 or Q4");
    const int64_t sliding = count_sliding_layers(c);
    const bool capped = window_capacity > 0 && sliding > 0, two = capped && sliding < c.n_layers;
    n_classes_ = two ? 2 : 1;
    for (int64_t l = 0; two && l < c.n_layers; ++l) class_[size_t(l)] = c.attention_window(l) > 0;
    capacity_ = {capped && !two ? window_capacity : capacity, two ? window_capacity : capacity};
    for (auto& l : lengths_) l.assign(size_t(batch), 0);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const size_t n = size_t(batch * c.n_kv_heads * capacity_[class_[size_t(l)]]) * row_nbytes(dtype, c.head_dim);
      k_.emplace_back(n);
      v_.emplace_back(n);
    }
  }
  // With a policy: per-sequence budgets (of class 1: window_budgets), tokens seen, and the
  // per-layer scores/positions of the layers whose class has a bounded budget.
  void enable_policy(const ModelConfig& c, std::vector<KvBudget> budgets, std::vector<KvBudget> window_budgets = {}) {
    budgets_[0] = std::move(budgets);
    budgets_[1] = std::move(window_budgets);
    state_.assign(k_.size(), KvPolicyState{});
    for (size_t l = 0; l < state_.size(); ++l) {
      if (any_bounded(budgets_[size_t(layer_class(int(l)))]))
        state_[l].reset(batch_, c.n_kv_heads, capacity(layer_class(int(l))));
    }
    seen_.assign(size_t(batch_), 0);
  }
  bool has_policy() const { return !state_.empty(); }
  // Null for a layer that never evicts (EvictArgs::state).
  KvPolicyState* state(int layer) { return state_[size_t(layer)].capacity ? &state_[size_t(layer)] : nullptr; }
  const std::vector<KvBudget>& budgets(int cls = 0) const { return budgets_[size_t(cls)]; }
  std::vector<int32_t>& seen() { return seen_; }
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  int64_t batch() const { return batch_; }
  int n_classes() const { return n_classes_; }
  int layer_class(int layer) const { return class_[size_t(layer)]; }
  int64_t capacity(int cls = 0) const { return capacity_[size_t(cls)]; }
  DType dtype() const { return dtype_; }
  // Tokens cached for sequence b (in the layers of class cls).
  int64_t length(int64_t b, int cls = 0) const { return lengths_[size_t(cls)][size_t(b)]; }
  std::vector<int32_t>& lengths(int cls = 0) { return lengths_[size_t(cls)]; }
  // The whole batch as one segment of layer `layer`.
  KvSegment segment(int layer) {
    return KvSegment{k_[size_t(layer)].data(), v_[size_t(layer)].data(), dtype_, 0, batch_,
                     capacity(layer_class(layer))};
  }
  // Bytes of the K and V slots (a KV policy's score state is not counted: the offloading engine's
  // StepRunner::kv_bytes counts its slots alike).
  size_t bytes() const {
    size_t n = 0;
    for (size_t l = 0; l < k_.size(); ++l) n += k_[l].size() + v_[l].size();
    return n;
  }

 private:
  int64_t batch_;
  std::array<int64_t, 2> capacity_{};
  DType dtype_;
  int n_classes_ = 1;
  std::vector<uint8_t> class_;  // [layer]
  std::array<std::vector<int32_t>, 2> lengths_;
  std::vector<std::vector<std::byte>> k_, v_;
  std::vector<KvPolicyState> state_;
  std::array<std::vector<KvBudget>, 2> budgets_;
  std::vector<int32_t> seen_;
};

}  // namespace flexh2o
