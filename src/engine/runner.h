// StepRunner: what the generation driver needs from an engine — start a batch, run one token
// step, return each sequence's last-row logits. The in-memory Forward and the offloading
// engine both implement it, so one driver (generate.h) serves every placement.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/forward.h"
#include "engine/kv_evict.h"
#include "policies/kv_policy.h"

namespace flexh2o {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const ModelConfig& config() const = 0;
  // Largest batch one begin_batch() may hold (the driver cuts requests into such batches).
  virtual int64_t max_batch() const = 0;
  // Starts a batch of B sequences, each with room for `capacity` tokens (prompt + generated).
  virtual void begin_batch(int64_t B, int64_t capacity) = 0;
  // One token step; ids/positions [B, T] left-padded, sequence b's last real_rows[b] rows are
  // tokens (null: all T). logits <- [B, vocab] of each sequence's last row.
  virtual void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                    std::vector<float>& logits) = 0;
  // Bytes of KV cache the current batch holds (all tiers).
  virtual size_t kv_bytes() const = 0;
  // A hint before each step: whether another step (of this batch or the next) is expected after
  // it, so an engine may prefetch for it. A wrong hint costs time, never correctness.
  virtual void expect_more_steps(bool more) { (void)more; }
};

// Everything resident on the CPU: Forward + KvCache (the reference the offloading engine is
// tested against). With a KV policy (policies/kv_policy.h; null = full cache), each sequence's
// cache is kept at the policy's budget. The cache holds `kv_dtype` (F16 by default, as the
// offloading engine).
class InMemoryRunner final : public StepRunner {
 public:
  InMemoryRunner(Forward& fwd, int64_t max_batch, const KvPolicy* policy = nullptr, DType kv_dtype = DType::F16)
      : fwd_(fwd), max_batch_(max_batch), policy_(policy), kv_dtype_(kv_dtype) {}
  const ModelConfig& config() const override { return fwd_.model().config(); }
  int64_t max_batch() const override { return max_batch_; }
  void begin_batch(int64_t B, int64_t capacity) override {
    cache_.reset();
    batch_ = B;
    capacity_ = capacity;
  }
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override {
    if (!cache_) {  // the first step is the prefill: budgets follow the prompt lengths
      std::vector<KvBudget> budgets;
      int64_t cap = capacity_;
      if (policy_) {
        int64_t need = T;
        for (int64_t b = 0; b < batch_; ++b) {
          budgets.push_back(policy_->budget(real_rows ? real_rows[b] : T));
          if (!budgets.back().unbounded) need = std::max(need, budgets.back().total());
          else need = capacity_;
        }
        cap = std::min(capacity_, need);  // prompt during prefill, then at most the budget
        check_window_budgets(config(), budgets, capacity_);
      }
      cache_.emplace(config(), batch_, cap, kv_dtype_);
      if (policy_) cache_->enable_policy(config(), std::move(budgets));
    }
    fwd_.step(ids, positions, T, real_rows, *cache_, LogitsRows::kLast, logits, policy_);
  }
  size_t kv_bytes() const override { return cache_ ? cache_->bytes() : 0; }

 private:
  Forward& fwd_;
  int64_t max_batch_;
  const KvPolicy* policy_;
  DType kv_dtype_;
  int64_t batch_ = 0, capacity_ = 0;
  std::optional<KvCache> cache_;
};

}  // namespace flexh2o
