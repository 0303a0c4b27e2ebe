// StepRunner: what the generation driver needs from an engine — start a batch, run one token
// step, return each sequence's last-row logits. The in-memory Forward and the offloading
// engine both implement it, so one driver (generate.h) serves every placement.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
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
  // Bytes of the K/V slots the current batch allocated (all tiers; not a KV policy's score state).
  virtual size_t kv_bytes() const = 0;
  // A hint before each step: whether another step (of this batch or the next) is expected after
  // it, so an engine may prefetch for it. A wrong hint costs time, never correctness.
  virtual void expect_more_steps(bool more) { (void)more; }
  // Before a batch's first step: its later steps may be up to `rows` wide, wider than the first
  // (continuous batching's refill steps). An engine that sizes its buffers at the first step
  // sizes them for the wider of the two, unless the batch cannot rewind (and so never refills);
  // without this no step may be wider than the first.
  virtual void reserve_rows(int64_t rows) { (void)rows; }
  // Before a batch's first step: the length each sequence's KV budget is a share of, when the
  // runner's policy gives ratios (KvPolicy::budget; default: the sequence's prefill rows).
  // Scoring a whole sequence a token a step from its first token passes its length, so that a
  // ratio keeps that share of the sequence (as eval-ppl and loglikelihood_rolling do), not of one
  // token. lengths.size() is the batch; each at least 1. Every runner with a KV policy honours it.
  virtual void budget_lengths(std::span<const int64_t> lengths) = 0;
  // Throws, with what each tier would need, when a batch of lengths.size() sequences (sequence
  // b's prompt, lengths[b] tokens, the base of its KV budget) whose widest step is `rows` wide
  // (its first, or continuous batching's refills: reserve_rows()) and whose sequences hold up to
  // `capacity` tokens would not fit the runner's memory budgets; so a driver can refuse a run
  // before its first result rather than at the batch that does not fit. Allocates nothing. A
  // runner without budgets accepts every batch.
  virtual void check_batch(std::span<const int64_t> lengths, int64_t rows, int64_t capacity) const {
    (void)lengths, (void)rows, (void)capacity;
  }
  // Continuous batching. Asked after the batch's first step: whether rewind() may be called (a
  // full cache with no KV policy or window cap).
  virtual bool can_rewind() const { return false; }
  // Before a batch: whether one whose sequences hold up to `capacity` tokens will rewind
  // (can_rewind() after its first step), so that a driver knows ahead of a run which batches a
  // continuous run forms (check_batches()).
  virtual bool rewinds(int64_t capacity) const {
    (void)capacity;
    return false;
  }
  // Keeps only sequence b's first `len` cached tokens: the next step's rows for b are written
  // from slot len on (len 0: a new sequence in b's slot; else rows recomputed so that b can
  // take part in a step of T rows, each of its rows a token). Throws unless can_rewind().
  virtual void rewind(int64_t b, int64_t len);
  // Scoring. Whether step_rows() may ask for more than one row: a runner without a KV policy,
  // whose logits of a step's rows are those that feeding the rows one step at a time would give
  // (up to rounding). Steps after the first may have more than one row only where can_rewind().
  virtual bool can_step_rows() const { return false; }
  // step() returning the logits of each sequence's last `rows` rows (1 <= rows <= T): [rows, B,
  // vocab], block i the rows T - rows + i; a padding row's logits are unspecified. A batch's
  // later steps ask for at most as many rows as its first. rows 1 is step(); more throws unless
  // can_step_rows().
  virtual void step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                         int64_t rows, std::vector<float>& logits);
  // Once `*stop` is set (a stop signal; borrowed, null: none), a step under way ends early by
  // throwing StepStopped: between two layers or schedule units, so that a stop waits for one of
  // those and not for a whole step (a large batch's prefill takes minutes). The batch is then
  // over: begin_batch() before the next step. A runner whose steps cannot end early ignores it.
  // Call it between steps, on the thread that steps (a step's threads read the pointer); the
  // flag itself may be set from any thread.
  virtual void stop_steps_on(const std::atomic<bool>* stop) { (void)stop; }
};

// Sets runner.stop_steps_on(stop) for its lifetime, none again after it (so scopes do not nest:
// the drivers that run steps hold one each, their callers none).
class StepStopScope {
 public:
  StepStopScope(StepRunner& runner, const std::atomic<bool>* stop) : runner_(runner) { runner_.stop_steps_on(stop); }
  ~StepStopScope() { runner_.stop_steps_on(nullptr); }
  StepStopScope(const StepStopScope&) = delete;
  StepStopScope& operator=(const StepStopScope&) = delete;

 private:
  StepRunner& runner_;
};

// Everything resident on the CPU: Forward + KvCache (the reference the offloading engine is
// tested against). With a KV policy (policies/kv_policy.h; null = full cache), each sequence's
// cache is kept at the policy's budget. The full cache of a model with sliding layers keeps
// only the window in those once sequences pass it, as the offloading engine does
// (full_cache_window(); window_cap false: every layer keeps every token). The cache holds
// `kv_dtype` (F16 by default, as the offloading engine).
// Throws unless `lengths` suits budget_lengths() of a batch of `batch` before its first step.
void check_budget_lengths(std::span<const int64_t> lengths, int64_t batch, bool first_step_done);

class InMemoryRunner final : public StepRunner {
 public:
  InMemoryRunner(Forward& fwd, int64_t max_batch, const KvPolicy* policy = nullptr, DType kv_dtype = DType::F16,
                 bool window_cap = true);
  const ModelConfig& config() const override { return fwd_.model().config(); }
  int64_t max_batch() const override { return max_batch_; }
  void begin_batch(int64_t B, int64_t capacity) override {
    cache_.reset();
    batch_ = B;
    capacity_ = capacity;
    budget_lengths_.clear();
  }
  void budget_lengths(std::span<const int64_t> lengths) override;
  // Refuses a KV budget wider than a sliding window the batch's sequences pass
  // (check_window_budgets), as the prefill would; memory is not budgeted here.
  void check_batch(std::span<const int64_t> lengths, int64_t rows, int64_t capacity) const override;
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override;
  size_t kv_bytes() const override { return cache_ ? cache_->bytes() : 0; }
  bool can_rewind() const override { return cache_ && rewinds(capacity_); }
  bool rewinds(int64_t capacity) const override {
    return policy_ == nullptr && (!window_cap_ || full_cache_window(config(), false, capacity) == 0);
  }
  void rewind(int64_t b, int64_t len) override;
  bool can_step_rows() const override { return policy_ == nullptr; }
  void step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows, int64_t rows,
                 std::vector<float>& logits) override;
  void stop_steps_on(const std::atomic<bool>* stop) override { stop_ = stop; }  // between layers
  // The current batch's window cap (full_cache_window()), 0: none.
  int64_t window_cap() const { return window_; }

 private:
  Forward& fwd_;
  int64_t max_batch_;
  const KvPolicy* policy_;
  DType kv_dtype_;
  bool window_cap_;
  std::unique_ptr<KvPolicy> window_policy_;  // `local` at the sliding window
  int64_t batch_ = 0, capacity_ = 0, window_ = 0;
  std::vector<int64_t> budget_lengths_;  // budget_lengths() of this batch; empty: prefill rows
  std::optional<KvCache> cache_;
  const std::atomic<bool>* stop_ = nullptr;
};

}  // namespace flexh2o
