// KV cache of one batch of sequences, all layers, fp32, slot-indexed.
// Layout per layer: K and V each [batch, kv_heads, capacity, head_dim]. Slots [0, length)
// are filled; sequence b's slots before key_start[b] are left padding (never attended).
// Owns its memory; move-only; not thread-safe (one batch is driven by one thread).
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/config.h"

namespace flexh2o {

class KvCache {
 public:
  KvCache(const ModelConfig& c, int64_t batch, int64_t capacity)
      : batch_(batch), kv_heads_(c.n_kv_heads), head_dim_(c.head_dim), capacity_(capacity),
        key_start_(size_t(batch), 0) {
    FH_CHECK(batch > 0 && capacity > 0, "KV cache needs batch > 0 and capacity > 0");
    const size_t per_layer = size_t(batch * kv_heads_ * capacity * head_dim_);
    k_.resize(size_t(c.n_layers));
    v_.resize(size_t(c.n_layers));
    for (auto& x : k_) x.assign(per_layer, 0.f);
    for (auto& x : v_) x.assign(per_layer, 0.f);
  }
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  int64_t batch() const { return batch_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }
  void set_length(int64_t n) {
    FH_CHECK(n >= 0 && n <= capacity_, "KV length ", n, " outside capacity ", capacity_);
    length_ = n;
  }
  float* k(int layer) { return k_[size_t(layer)].data(); }
  float* v(int layer) { return v_[size_t(layer)].data(); }
  std::vector<int32_t>& key_start() { return key_start_; }
  size_t bytes() const { return k_.size() * 2 * k_[0].size() * sizeof(float); }

 private:
  int64_t batch_, kv_heads_, head_dim_, capacity_;
  int64_t length_ = 0;
  std::vector<int32_t> key_start_;
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace flexh2o
