// InMemoryRunner: the prefill sizes the cache from the prompt lengths and the KV policy (or a
// full cache's window cap); every step runs Forward over it.
#include "engine/runner.h"

#include <algorithm>

#include "core/error.h"

namespace flexh2o {

void StepRunner::rewind(int64_t b, int64_t len) {
  (void)b, (void)len;
  FH_FAIL("this runner cannot rewind a sequence (can_rewind() is false)");
}

void InMemoryRunner::rewind(int64_t b, int64_t len) {
  FH_CHECK(can_rewind(), "rewind() needs a full cache without a KV policy or window cap, after the first step");
  FH_CHECK(b >= 0 && b < batch_, "sequence ", b, " outside the batch of ", batch_);
  for (int k = 0; k < cache_->n_classes(); ++k) {
    int32_t& n = cache_->lengths(k)[size_t(b)];
    FH_CHECK(len >= 0 && len <= n, "rewind of sequence ", b, " to ", len, " tokens; it has ", n);
    n = int32_t(len);
  }
}

// The checks both runners make of budget_lengths().
void check_budget_lengths(std::span<const int64_t> lengths, int64_t batch, bool first_step_done) {
  FH_CHECK(!first_step_done, "budget_lengths() after the batch's first step");
  FH_CHECK(int64_t(lengths.size()) == batch, "budget_lengths() of ", lengths.size(), " sequences, batch of ", batch);
  for (int64_t n : lengths) FH_CHECK(n >= 1, "budget length ", n, " below 1");
}

void InMemoryRunner::budget_lengths(std::span<const int64_t> lengths) {
  check_budget_lengths(lengths, batch_, cache_.has_value());
  budget_lengths_.assign(lengths.begin(), lengths.end());
}

void StepRunner::step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                           int64_t rows, std::vector<float>& logits) {
  FH_CHECK(rows == 1, "this runner returns the last row's logits only (can_step_rows() is false), asked for ", rows);
  step(ids, positions, T, real_rows, logits);
}

InMemoryRunner::InMemoryRunner(Forward& fwd, int64_t max_batch, const KvPolicy* policy, DType kv_dtype,
                               bool window_cap)
    : fwd_(fwd), max_batch_(max_batch), policy_(policy), kv_dtype_(kv_dtype), window_cap_(window_cap) {
  if (fwd.model().config().sliding_window > 0) window_policy_ = make_policy(window_local_policy(fwd.model().config()));
}

void InMemoryRunner::check_batch(std::span<const int64_t> lengths, int64_t rows, int64_t capacity) const {
  (void)rows;
  if (!policy_) return;  // a window cap applies only to the full cache, its budgets the window's
  std::vector<KvBudget> budgets;
  for (const int64_t n : lengths) budgets.push_back(policy_->budget(n));
  check_window_budgets(config(), budgets, capacity, lengths);
}

void InMemoryRunner::step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                          std::vector<float>& logits) {
  step_rows(ids, positions, T, real_rows, 1, logits);
}

void InMemoryRunner::step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                               int64_t rows, std::vector<float>& logits) {
  const ModelConfig& c = config();
  FH_CHECK(rows == 1 || can_step_rows(), "logits of ", rows, " rows a step need a runner without a KV policy");
  if (!cache_) {  // the first step is the prefill: budgets follow the prompt lengths
    window_ = window_cap_ ? full_cache_window(c, policy_ != nullptr, capacity_) : 0;
    const KvPolicy* policy = window_ ? window_policy_.get() : policy_;
    // A cap of a model whose other layers attend to everything: those keep every token.
    const bool mixed = window_ && count_sliding_layers(c) < c.n_layers;
    std::vector<KvBudget> budgets, window_budgets;
    std::vector<int64_t> bases;
    int64_t cap = capacity_;
    if (policy) {
      int64_t need = T;
      for (int64_t b = 0; b < batch_; ++b) {
        const int64_t basis = !budget_lengths_.empty() ? budget_lengths_[size_t(b)] : real_rows ? real_rows[b] : T;
        bases.push_back(basis);
        const KvBudget kb = policy->budget(basis);
        (mixed ? window_budgets : budgets).push_back(kb);
        if (mixed) budgets.push_back(KvBudget{.unbounded = true});
        need = mixed || kb.unbounded ? capacity_ : std::max(need, kb.total());
      }
      cap = std::min(capacity_, need);  // prompt during prefill, then at most the budget
      check_window_budgets(c, budgets, capacity_, bases);
      check_window_budgets(c, window_budgets, capacity_, bases);
    }
    const int64_t window_slots = window_ ? std::min(capacity_, std::max(T, window_)) : 0;
    cache_.emplace(c, batch_, cap, kv_dtype_, window_slots);
    if (policy) cache_->enable_policy(c, std::move(budgets), std::move(window_budgets));
  }
  fwd_.step(ids, positions, T, real_rows, *cache_, LogitsRows::last_rows(rows), logits,
            window_ ? window_policy_.get() : policy_, stop_);
}

}  // namespace flexh2o
