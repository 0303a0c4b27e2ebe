// Batch generation driver: left padding, prefill, decode loop, stopping, stats.
#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>

#include <tbb/parallel_for.h>

#include "core/error.h"

namespace flexh2o {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopped: return "stop";
    case FinishReason::kLength: break;
  }
  return "length";
}

void validate_request(const GenerationRequest& r, const ModelConfig& c) {
  if (r.prompt_ids.empty()) FH_FAIL("empty prompt: give at least one token");
  for (int32_t id : r.prompt_ids)
    if (id < 0 || id >= c.vocab_size) FH_FAIL("prompt token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")");
  if (int64_t(r.prompt_ids.size()) > c.max_positions)
    FH_FAIL("prompt is ", r.prompt_ids.size(), " tokens, longer than the model's max_position_embeddings (",
            c.max_positions, ")");
  if (r.max_new_tokens < 0) FH_FAIL("max_new_tokens must be >= 0, got ", r.max_new_tokens);
  if (r.top_logprobs < -1 || r.top_logprobs > kMaxTopLogprobs)
    FH_FAIL("logprobs must be in [0, ", kMaxTopLogprobs, "] (or absent), got ", r.top_logprobs);
  validate(r.sampling, c.vocab_size);
}

namespace {

using Clock = std::chrono::steady_clock;
bool stop_requested(const GenerateOptions& o) { return o.stop && o.stop->load(std::memory_order_relaxed); }
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One batch from its padded prompt to its last token: the step inputs it needs next and what
// each step's logits mean (sampling, stopping, results). Both drivers run batches through it.
class BatchRun {
 public:
  BatchRun(const ModelConfig& c, const std::vector<GenerationRequest>& reqs, size_t first, size_t count,
           const GenerateOptions& opts, std::vector<GenerationResult>& out, GenerateStats& st, int64_t& done_tokens,
           int64_t total_tokens)
      : c_(c), reqs_(reqs), first_(first), B_(int64_t(count)), opts_(opts), out_(out), st_(st), done_(done_tokens),
        total_(total_tokens) {
    int64_t max_new = 0;
    for (size_t b = 0; b < count; ++b) {
      const GenerationRequest& r = reqs[first + b];
      S_ = std::max<int64_t>(S_, int64_t(r.prompt_ids.size()));
      // A sequence cannot grow past the model's positions.
      const int64_t room = c.max_positions - int64_t(r.prompt_ids.size());
      max_new = std::max<int64_t>(max_new, std::min(r.max_new_tokens, room));
    }
    capacity_ = S_ + std::max<int64_t>(max_new, 1);
    steps_ = std::max<int64_t>(max_new, 1);
    ids_.assign(size_t(B_ * S_), opts.pad_id);
    pos_.assign(size_t(B_ * S_), 0);
    len_.resize(size_t(B_));
    real_rows_.resize(size_t(B_));
    for (int64_t b = 0; b < B_; ++b) {
      const auto& p = reqs[first + size_t(b)].prompt_ids;
      const int64_t pad = S_ - int64_t(p.size());
      real_rows_[size_t(b)] = int32_t(p.size());
      for (int64_t t = 0; t < int64_t(p.size()); ++t) {
        ids_[size_t(b * S_ + pad + t)] = p[size_t(t)];
        pos_[size_t(b * S_ + pad + t)] = int32_t(t);
      }
      len_[size_t(b)] = int64_t(p.size());
      st.prompt_tokens += int64_t(p.size());
    }
    st.padded_prompt_tokens += B_ * S_;
    finished_.assign(size_t(B_), false);
    for (int64_t b = 0; b < B_; ++b) {
      const GenerationRequest& r = reqs[first + size_t(b)];
      samplers_.emplace_back(r.sampling);
      if (r.max_new_tokens == 0 || len_[size_t(b)] >= c.max_positions) {
        finished_[size_t(b)] = true;
        out[first + size_t(b)].finished = true;
        if (opts.on_result) opts.on_result(first + size_t(b), out[first + size_t(b)]);
      }
    }
  }

  int64_t batch() const { return B_; }
  int64_t capacity() const { return capacity_; }
  // The next step: the prefill first, then one token per sequence.
  bool prefill() const { return step_no_ == 0; }
  const int32_t* ids() const { return ids_.data(); }
  const int32_t* positions() const { return pos_.data(); }
  int64_t T() const { return prefill() ? S_ : 1; }
  const int32_t* real_rows() const { return prefill() ? real_rows_.data() : nullptr; }
  // Whether a step after the next one is expected without EOS (an engine's prefetch hint).
  bool more_after_next() const { return step_no_ + 1 < steps_; }

  // Samples the logits of the step just run; true when another step is needed (its inputs are
  // then ids() / positions()).
  bool consume(const std::vector<float>& logits) {
    if (step_no_++ > 0) ++st_.decode_steps;
    ids_.assign(size_t(B_), opts_.pad_id);
    pos_.assign(size_t(B_), 0);
    // Each sequence draws with its own sampler and RNG, so the draws run in parallel (sampling
    // a large vocabulary is on the path between two steps) and give the same tokens serially.
    toks_.assign(size_t(B_), 0);
    tbb::parallel_for(int64_t(0), B_, [&](int64_t b) {
      const size_t bi = size_t(b);
      if (finished_[bi]) return;
      const GenerationRequest& r = reqs_[first_ + bi];
      GenerationResult& res = out_[first_ + bi];
      const float* row = logits.data() + b * c_.vocab_size;
      const int32_t tok = samplers_[bi].sample(row, c_.vocab_size, {r.prompt_ids, res.tokens});
      if (r.top_logprobs >= 0) {
        std::vector<TokenLogprob> top;
        res.logprobs.push_back(token_logprob(row, c_.vocab_size, tok, r.top_logprobs, &top));
        if (r.top_logprobs > 0) res.top_logprobs.push_back(std::move(top));
      }
      toks_[bi] = tok;
    });
    bool any = false;
    for (int64_t b = 0; b < B_; ++b) {
      const size_t bi = size_t(b);
      if (finished_[bi]) continue;
      const GenerationRequest& r = reqs_[first_ + bi];
      GenerationResult& res = out_[first_ + bi];
      const int32_t tok = toks_[bi];
      res.tokens.push_back(tok);
      ++st_.generated_tokens;
      ++done_;
      const bool eos = !opts_.ignore_eos && opts_.eos_id && tok == *opts_.eos_id;
      const int64_t total_len = len_[bi] + int64_t(res.tokens.size());
      const bool length = int64_t(res.tokens.size()) >= r.max_new_tokens || total_len >= c_.max_positions;
      const bool stopped = !eos && !length && opts_.ends_at && opts_.ends_at(first_ + bi, res.tokens);
      if (eos || length || stopped) {
        finished_[bi] = true;
        res.finish = eos ? FinishReason::kEos : stopped ? FinishReason::kStopped : FinishReason::kLength;
        res.finished = true;
        if (opts_.on_result) opts_.on_result(first_ + bi, res);
        continue;
      }
      // Finished sequences ride along with a harmless token; their output is ignored.
      any = true;
      ids_[bi] = tok;
      pos_[bi] = int32_t(total_len - 1);
    }
    if (opts_.on_progress) opts_.on_progress(done_, total_);
    return any;
  }

 private:
  const ModelConfig& c_;
  const std::vector<GenerationRequest>& reqs_;
  size_t first_;
  int64_t B_, S_ = 0, capacity_ = 0, steps_ = 1, step_no_ = 0;
  const GenerateOptions& opts_;
  std::vector<GenerationResult>& out_;
  std::vector<int32_t> toks_;  // this step's draws
  GenerateStats& st_;
  int64_t& done_;
  int64_t total_;
  std::vector<int32_t> ids_, pos_, real_rows_;
  std::vector<int64_t> len_;
  std::vector<Sampler> samplers_;
  std::vector<bool> finished_;
};

void run_batch(StepRunner& run, BatchRun& b, GenerateStats& st, const GenerateOptions& opts, bool last_batch) {
  run.begin_batch(b.batch(), b.capacity());
  std::vector<float> logits;
  auto t0 = Clock::now();
  bool more = true;
  while (more) {
    const bool prefill = b.prefill();
    run.expect_more_steps(b.more_after_next() || !last_batch);
    run.step(b.ids(), b.positions(), b.T(), b.real_rows(), logits);
    if (prefill) {
      st.prefill_seconds += seconds_since(t0);
      st.peak_kv_bytes = std::max(st.peak_kv_bytes, run.kv_bytes());
      t0 = Clock::now();
    }
    more = b.consume(logits);
    if (more && stop_requested(opts)) {  // every token sampled so far is kept; unfinished ones are dropped
      st.interrupted = true;
      break;
    }
  }
  st.decode_seconds += seconds_since(t0);
}

std::vector<GenerationResult> start(const ModelConfig& c, int64_t batch, const std::vector<GenerationRequest>& requests,
                                    int64_t& total) {
  FH_CHECK(batch > 0, "batch size must be positive, got ", batch);
  for (const auto& r : requests) validate_request(r, c);
  for (const auto& r : requests) total += r.max_new_tokens;
  return std::vector<GenerationResult>(requests.size());
}

}  // namespace

std::vector<size_t> length_sorted_order(const std::vector<GenerationRequest>& requests, int64_t batch,
                                        int64_t window_batches) {
  FH_CHECK(batch > 0, "batch size must be positive, got ", batch);
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t(0));
  if (window_batches <= 1) return order;
  const size_t window = size_t(batch) * size_t(window_batches);
  for (size_t first = 0; first < order.size(); first += window) {
    const auto end = order.begin() + std::ptrdiff_t(std::min(order.size(), first + window));
    std::stable_sort(order.begin() + std::ptrdiff_t(first), end, [&](size_t a, size_t b) {
      const GenerationRequest &x = requests[a], &y = requests[b];
      if (x.prompt_ids.size() != y.prompt_ids.size()) return x.prompt_ids.size() < y.prompt_ids.size();
      return x.max_new_tokens < y.max_new_tokens;
    });
  }
  return order;
}

std::vector<GenerationResult> generate(Forward& fwd, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats) {
  FH_CHECK(opts.batch_size > 0, "batch size must be positive, got ", opts.batch_size);
  InMemoryRunner runner(fwd, opts.batch_size);
  return generate(runner, requests, opts, stats);
}

std::vector<GenerationResult> generate(StepRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats) {
  const int64_t batch = runner.max_batch();
  int64_t total = 0, done = 0;
  std::vector<GenerationResult> out = start(runner.config(), batch, requests, total);
  GenerateStats st;
  for (size_t first = 0; first < requests.size() && !st.interrupted; first += size_t(batch)) {
    if (stop_requested(opts)) {
      st.interrupted = true;
      break;
    }
    const size_t count = std::min(requests.size() - first, size_t(batch));
    BatchRun b(runner.config(), requests, first, count, opts, out, st, done, total);
    run_batch(runner, b, st, opts, first + count >= requests.size());
    ++st.batches;  // an interrupted batch ran too (its prefill at least)
  }
  if (stats) *stats = st;
  return out;
}

std::vector<GenerationResult> generate(StepRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const std::vector<size_t>& order, const GenerateOptions& opts,
                                       GenerateStats* stats) {
  FH_CHECK(order.size() == requests.size(), "an order of ", order.size(), " for ", requests.size(), " requests");
  std::vector<GenerationRequest> run;
  run.reserve(requests.size());
  std::vector<bool> seen(requests.size(), false);
  for (size_t r : order) {
    FH_CHECK(r < requests.size() && !seen[r], "the order is not a permutation of the requests");
    seen[r] = true;
    run.push_back(requests[r]);
  }
  GenerateOptions o = opts;
  if (opts.ends_at) o.ends_at = [&](size_t j, std::span<const int32_t> t) { return opts.ends_at(order[j], t); };
  if (opts.on_result) o.on_result = [&](size_t j, const GenerationResult& res) { opts.on_result(order[j], res); };
  std::vector<GenerationResult> got = generate(runner, run, o, stats);
  std::vector<GenerationResult> out(requests.size());
  for (size_t j = 0; j < order.size(); ++j) out[order[j]] = std::move(got[j]);
  return out;
}

std::vector<GenerationResult> generate(GroupRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats) {
  const int64_t batch = runner.max_batch();
  int64_t total = 0, done = 0;
  std::vector<GenerationResult> out = start(runner.config(), batch, requests, total);
  FH_CHECK(runner.groups() >= 1, "a group runner needs at least one group");
  GenerateStats st;
  std::vector<std::unique_ptr<BatchRun>> slot(size_t(runner.groups()));
  size_t next = 0;
  int in_flight = 0;
  auto submit = [&](int g) {
    BatchRun& b = *slot[size_t(g)];
    runner.submit(g, b.ids(), b.positions(), b.T(), b.real_rows());
    ++in_flight;
  };
  // Group g takes the next batch of requests; false when none is left.
  auto take = [&](int g) {
    if (next >= requests.size() || stop_requested(opts)) return false;
    const size_t count = std::min(requests.size() - next, size_t(batch));
    slot[size_t(g)] = std::make_unique<BatchRun>(runner.config(), requests, next, count, opts, out, st, done, total);
    next += count;
    ++st.batches;
    runner.begin_batch(g, slot[size_t(g)]->batch(), slot[size_t(g)]->capacity());
    submit(g);
    return true;
  };
  for (int g = 0; g < runner.groups(); ++g)
    if (!take(g)) break;
  std::vector<float> logits;
  while (in_flight > 0) {
    auto t0 = Clock::now();
    const int g = runner.collect(logits);
    --in_flight;
    BatchRun& b = *slot[size_t(g)];
    const bool prefill = b.prefill();
    (prefill ? st.prefill_seconds : st.decode_seconds) += seconds_since(t0);
    t0 = Clock::now();
    const bool more = b.consume(logits);
    if (stop_requested(opts)) {  // in-flight steps are still collected (their tokens kept)
      st.interrupted = st.interrupted || more || next < requests.size();
    } else if (more) {
      submit(g);
    } else {
      take(g);
    }
    st.decode_seconds += seconds_since(t0);
  }
  if (stop_requested(opts) && next < requests.size()) st.interrupted = true;
  if (stats) *stats = st;
  return out;
}

}  // namespace flexh2o
