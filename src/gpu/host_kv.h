// HostKv: the KV cache of the CUDA offloading runner when the policy homes it on the host
// (--percent .. 0 100 .. --cpu-cache-compute, FlexGen's 30B/175B shape): fp32 homes per layer,
// K and V each [batch, kv_heads, capacity, head_dim], left-aligned like engine/layer_compute.h.
// The device computes the projections; rows cross the link in the compute dtype (F16/BF16):
// the prefill's K/V rows come down once (store_rows), each later step's q/k/v come down and
// the attention output goes back up (attend), with the attention itself on the CPU kernels
// and the KV policy (H2O, ...) applied right there by engine/kv_evict. Plain C++, no CUDA.
// Not thread-safe: calls for one batch must not overlap (the runner serialises them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "engine/kv_evict.h"
#include "engine/layer_compute.h"
#include "model/config.h"
#include "policies/kv_policy.h"

namespace flexh2o::gpu {

class HostKv {
 public:
  // `dt`: F16 or BF16, the dtype of every row handed in or out. `policy` (may be null) must
  // outlive this object.
  HostKv(const ModelConfig& c, DType dt, const KvPolicy* policy);

  // A batch of `batch` sequences whose first step (the prefill) has T rows, real_rows[b] of
  // them real (null: all). The homes hold `capacity` slots, or with a bounded policy only the
  // largest budget (the prefill is evicted before it is stored). Returns that capacity. Homes are reused when large enough and never zero-filled: only
  // slots below a sequence's length are ever read.
  int64_t begin(int64_t batch, int64_t capacity, int64_t T, const int32_t* real_rows);
  // Before a step's first store/attend: seq_keys[b] = cached tokens once its rows are written.
  // Throws Error when a sequence outgrows the capacity.
  void begin_step(const int32_t* seq_keys);
  // Prefill rows of layer l for sequences [first, first + n) as the device wrote them: K and V
  // [n, kv_heads, rows, head_dim] in `dt` (sequence b's tokens in slots [0, seq_keys[b]));
  // scores [n, n_heads, rows] fp32 (each slot's summed attention) when the policy needs them,
  // else null (read only). With a policy, evicts (stable compaction) in an fp32 copy of the
  // block first and stores only the kept rows.
  void store_rows(int64_t l, int64_t first, int64_t n, int64_t rows, const void* k, const void* v,
                  const float* scores);
  // A later step's attention for layer l, sequences [first, first + n), T rows each: q
  // [n*T, q_dim], k and v [n*T, kv_dim] in `dt` (after bias / rotary), out [n*T, q_dim] in `dt`.
  // The new K/V rows are written into the homes, then the policy runs (move-last).
  void attend(int64_t l, int64_t first, int64_t n, int64_t T, const void* q, const void* k, const void* v,
              void* out);
  // After every layer of the step: lengths become the kept counts.
  void end_step();

  const std::vector<int32_t>& lengths() const { return lengths_; }
  int64_t capacity() const { return cap_; }
  size_t bytes() const;  // the homes of this batch: 2 * layers * batch * kv_heads * cap * head_dim * 4
  const KvPolicyState* state(int64_t l) const;  // null without a policy
  const float* k_home(int64_t l) const { return k_[size_t(l)].get(); }
  const float* v_home(int64_t l) const { return v_[size_t(l)].get(); }

 private:
  void evict(int64_t l, int64_t first, int64_t n, const KvSegment& seg, bool prefill);
  size_t home_floats() const { return size_t(batch_ * c_.n_kv_heads * cap_ * c_.head_dim); }

  ModelConfig c_;
  DType dt_;
  const KvPolicy* policy_;
  int64_t batch_ = 0, cap_ = 0, allocated_ = 0;
  bool prefill_ = false;  // between begin() and the first end_step()
  std::vector<std::unique_ptr<float[]>> k_, v_;  // [layer] homes
  std::vector<int32_t> lengths_, keys_, final_, seen_, after_;
  std::vector<KvBudget> budgets_;
  std::vector<KvPolicyState> state_;
  std::vector<float> q32_, k32_, v32_, scores_, tmp_k_, tmp_v_;
  std::vector<int32_t> dirty_lo_, dirty_hi_;
  LayerCompute cpu_;
};

// dt (F16/BF16) <-> fp32 rows, in parallel for large counts.
void to_f32(DType dt, const void* src, int64_t n, float* dst);
void from_f32(DType dt, const float* src, int64_t n, void* dst);

}  // namespace flexh2o::gpu
