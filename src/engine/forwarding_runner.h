// ForwardingRunner: a StepRunner that hands every call to another one, for wrappers that watch
// or restrict a runner (tests that record logits or count steps, a benchmark hiding a
// capability). A subclass overrides only what it changes.
#pragma once

#include "engine/runner.h"

namespace flexh2o {

// Borrows `inner`, which must outlive it. Thread-safety and blocking are inner's.
class ForwardingRunner : public StepRunner {
 public:
  explicit ForwardingRunner(StepRunner& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  int64_t max_batch() const override { return inner_.max_batch(); }
  void begin_batch(int64_t B, int64_t capacity) override { inner_.begin_batch(B, capacity); }
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override {
    inner_.step(ids, positions, T, real_rows, logits);
  }
  size_t kv_bytes() const override { return inner_.kv_bytes(); }
  void expect_more_steps(bool more) override { inner_.expect_more_steps(more); }
  void reserve_rows(int64_t rows) override { inner_.reserve_rows(rows); }
  void budget_lengths(std::span<const int64_t> lengths) override { inner_.budget_lengths(lengths); }
  void check_batch(std::span<const int64_t> lengths, int64_t rows, int64_t capacity) const override {
    inner_.check_batch(lengths, rows, capacity);
  }
  bool can_rewind() const override { return inner_.can_rewind(); }
  bool rewinds(int64_t capacity) const override { return inner_.rewinds(capacity); }
  void rewind(int64_t b, int64_t len) override { inner_.rewind(b, len); }
  bool can_step_rows() const override { return inner_.can_step_rows(); }
  void step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows, int64_t rows,
                 std::vector<float>& logits) override {
    inner_.step_rows(ids, positions, T, real_rows, rows, logits);
  }
  void stop_steps_on(const std::atomic<bool>* stop) override { inner_.stop_steps_on(stop); }

 protected:
  StepRunner& inner() { return inner_; }

 private:
  StepRunner& inner_;
};

}  // namespace flexh2o
