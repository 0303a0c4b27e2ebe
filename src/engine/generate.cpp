// Batch generation driver: left padding, prefill, decode loop, stopping, stats.
#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <utility>

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

// A request that ends before its first token (max_new_tokens 0, or no room left in the model's
// positions): it takes no slot.
bool ends_at_once(const GenerationRequest& r, const ModelConfig& c) {
  return r.max_new_tokens == 0 || int64_t(r.prompt_ids.size()) >= c.max_positions;
}

// The tokens a request may still add: its max_new_tokens within the model's positions.
int64_t room_for(const GenerationRequest& r, const ModelConfig& c) {
  return std::min(r.max_new_tokens, c.max_positions - int64_t(r.prompt_ids.size()));
}

void finish(size_t r, std::vector<GenerationResult>& out, const GenerateOptions& opts) {
  out[r].finished = true;
  if (opts.on_result) opts.on_result(r, out[r]);
}

// One batch from its padded prompt to its last token: the step inputs it needs next and what
// each step's logits mean (sampling, stopping, results). Slot b holds request members[b]; under
// continuous batching a slot whose sequence ended takes another request (refill()). Both
// drivers run batches through it.
class BatchRun {
 public:
  // The prompts are left-padded to at least `min_rows` rows, and each slot gets room for at
  // least `min_capacity` tokens (a continuous run sizes both for every request it may take).
  BatchRun(const ModelConfig& c, const std::vector<GenerationRequest>& reqs, std::vector<size_t> members,
           const GenerateOptions& opts, std::vector<GenerationResult>& out, GenerateStats& st, int64_t& done_tokens,
           int64_t total_tokens, int64_t min_rows = 0, int64_t min_capacity = 0)
      : c_(c), reqs_(reqs), idx_(std::move(members)), B_(int64_t(idx_.size())), opts_(opts), out_(out), st_(st),
        done_(done_tokens), total_(total_tokens) {
    int64_t max_new = 0;
    for (size_t r : idx_) {
      S_ = std::max<int64_t>(S_, int64_t(reqs[r].prompt_ids.size()));
      max_new = std::max<int64_t>(max_new, room_for(reqs[r], c));  // a sequence cannot grow past the positions
    }
    S_ = std::max(S_, min_rows);
    capacity_ = std::max(S_ + std::max<int64_t>(max_new, 1), min_capacity);
    steps_ = std::max<int64_t>(max_new, 1);
    len_.assign(size_t(B_), 0);
    finished_.assign(size_t(B_), false);
    samplers_.reserve(size_t(B_));
    for (size_t r : idx_) samplers_.emplace_back(reqs[r].sampling);
    std::vector<std::pair<int64_t, size_t>> all;
    for (int64_t b = 0; b < B_; ++b) all.emplace_back(b, idx_[size_t(b)]);
    ids_.assign(size_t(B_), opts.pad_id);  // no sequence has a pending token yet
    pos_.assign(size_t(B_), 0);
    wide_step(all, S_, nullptr);
    for (int64_t b = 0; b < B_; ++b) {
      const size_t r = idx_[size_t(b)];
      if (ends_at_once(reqs[r], c)) end_now(b);
    }
  }

  int64_t batch() const { return B_; }
  int64_t capacity() const { return capacity_; }
  // The next step processes prompts: the prefill, or a refill's step.
  bool prefill() const { return T_ > 1 || step_no_ == 0; }
  const int32_t* ids() const { return ids_.data(); }
  const int32_t* positions() const { return pos_.data(); }
  int64_t T() const { return T_; }
  const int32_t* real_rows() const { return wide_ ? real_rows_.data() : nullptr; }
  // Whether a step after the next one is expected without EOS (an engine's prefetch hint).
  bool more_after_next() const { return step_no_ + 1 < steps_; }
  // Slots whose sequence has not ended.
  int64_t live() const { return B_ - int64_t(std::count(finished_.begin(), finished_.end(), true)); }
  // Slots whose sequence ended since the last call, and every ended slot.
  std::vector<int64_t> take_ended() { return std::exchange(ended_, {}); }
  std::vector<int64_t> free_slots() const {
    std::vector<int64_t> f;
    for (int64_t b = 0; b < B_; ++b)
      if (finished_[size_t(b)]) f.push_back(b);
    return f;
  }

  // Samples the logits of the step just run; true when another step is needed (its inputs are
  // then ids() / positions()).
  bool consume(const std::vector<float>& logits) {
    if (step_no_++ > 0) ++st_.decode_steps;
    T_ = 1;
    wide_ = false;
    ids_.assign(size_t(B_), opts_.pad_id);
    pos_.assign(size_t(B_), 0);
    // Each sequence draws with its own sampler and RNG, so the draws run in parallel (sampling
    // a large vocabulary is on the path between two steps) and give the same tokens serially.
    toks_.assign(size_t(B_), 0);
    tbb::parallel_for(int64_t(0), B_, [&](int64_t b) {
      const size_t bi = size_t(b);
      if (finished_[bi]) return;
      const GenerationRequest& r = reqs_[idx_[bi]];
      GenerationResult& res = out_[idx_[bi]];
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
      const GenerationRequest& r = reqs_[idx_[bi]];
      GenerationResult& res = out_[idx_[bi]];
      const int32_t tok = toks_[bi];
      res.tokens.push_back(tok);
      ++st_.generated_tokens;
      ++done_;
      const bool eos = !opts_.ignore_eos && opts_.eos_id && tok == *opts_.eos_id;
      const int64_t total_len = len_[bi] + int64_t(res.tokens.size());
      const bool length = int64_t(res.tokens.size()) >= r.max_new_tokens || total_len >= c_.max_positions;
      const bool stopped = !eos && !length && opts_.ends_at && opts_.ends_at(idx_[bi], res.tokens);
      if (eos || length || stopped) {
        res.finish = eos ? FinishReason::kEos : stopped ? FinishReason::kStopped : FinishReason::kLength;
        end_now(b);
        continue;
      }
      // Ended sequences ride along with a harmless token; their output is ignored.
      any = true;
      ids_[bi] = tok;
      pos_[bi] = int32_t(total_len - 1);
    }
    if (opts_.on_progress) opts_.on_progress(done_, total_);
    return any;
  }

  // Continuous batching, after consume(): each (slot, request) of `joins` (ended slots, requests
  // that do not end at once) starts in that slot at the next step, whose T is the longest
  // joining prompt. The kernels take a sequence's T rows as its last T slots, so a running
  // sequence cannot have padding over its cached tokens: it takes part with its last
  // min(T, tokens) tokens, the pending one last and the others recomputed. Returns the
  // (slot, tokens kept) each slot's cache must be rewound to before that step.
  std::vector<std::pair<int64_t, int64_t>> refill(const std::vector<std::pair<int64_t, size_t>>& joins) {
    int64_t T = 1;
    for (const auto& [b, r] : joins) {
      FH_CHECK(finished_[size_t(b)], "slot ", b, " still holds a running sequence");
      FH_CHECK(!ends_at_once(reqs_[r], c_), "a request that ends at once takes no slot");
      idx_[size_t(b)] = r;
      samplers_[size_t(b)] = Sampler(reqs_[r].sampling);
      finished_[size_t(b)] = false;
      T = std::max<int64_t>(T, int64_t(reqs_[r].prompt_ids.size()));
      steps_ = std::max(steps_, step_no_ + room_for(reqs_[r], c_));
    }
    FH_CHECK(T <= S_, "a joining prompt of ", T, " tokens is longer than the batch's ", S_, " rows");
    std::vector<std::pair<int64_t, int64_t>> rewinds;
    wide_step(joins, T, &rewinds);
    return rewinds;
  }

 private:
  // The next step as T rows a slot, left-padded: each slot of `prompts` its request's prompt
  // (from an empty cache); each running slot its last min(T, n) tokens (*rewinds gets the
  // tokens it keeps cached); each ended slot its pending pad token (from an empty cache).
  void wide_step(const std::vector<std::pair<int64_t, size_t>>& prompts, int64_t T,
                 std::vector<std::pair<int64_t, int64_t>>* rewinds) {
    std::vector<int32_t> ids(size_t(B_ * T), opts_.pad_id), pos(size_t(B_ * T), 0);
    real_rows_.assign(size_t(B_), 1);
    std::vector<bool> joining(size_t(B_), false);
    for (const auto& jr : prompts) joining[size_t(jr.first)] = true;
    for (int64_t b = 0; b < B_; ++b) {
      if (joining[size_t(b)] || finished_[size_t(b)]) {  // an ended slot: its pending pad token
        ids[size_t(b * T + T - 1)] = ids_[size_t(b)];
        pos[size_t(b * T + T - 1)] = pos_[size_t(b)];
        if (rewinds) rewinds->emplace_back(b, 0);
        continue;
      }
      FH_CHECK(rewinds, "a running sequence in a step of prompts");
      const std::vector<int32_t>& p = reqs_[idx_[size_t(b)]].prompt_ids;
      const std::vector<int32_t>& g = out_[idx_[size_t(b)]].tokens;
      const int64_t n = int64_t(p.size() + g.size()), np = int64_t(p.size()), r = std::min(T, n);
      for (int64_t j = n - r; j < n; ++j) {
        const size_t at = size_t(b * T + T - n + j);
        ids[at] = j < np ? p[size_t(j)] : g[size_t(j - np)];
        pos[at] = int32_t(j);
      }
      real_rows_[size_t(b)] = int32_t(r);
      rewinds->emplace_back(b, n - r);
    }
    for (const auto& [b, r] : prompts) {
      const auto& p = reqs_[r].prompt_ids;
      const int64_t pad = T - int64_t(p.size());
      real_rows_[size_t(b)] = int32_t(p.size());
      for (int64_t t = 0; t < int64_t(p.size()); ++t) {
        ids[size_t(b * T + pad + t)] = p[size_t(t)];
        pos[size_t(b * T + pad + t)] = int32_t(t);
      }
      len_[size_t(b)] = int64_t(p.size());
      st_.prompt_tokens += int64_t(p.size());
    }
    st_.padded_prompt_tokens += B_ * T;
    ids_ = std::move(ids);
    pos_ = std::move(pos);
    T_ = T;
    wide_ = true;
  }

  void end_now(int64_t b) {
    finished_[size_t(b)] = true;
    ended_.push_back(b);
    finish(idx_[size_t(b)], out_, opts_);
  }

  const ModelConfig& c_;
  const std::vector<GenerationRequest>& reqs_;
  std::vector<size_t> idx_;  // the request in each slot
  int64_t B_, S_ = 0, capacity_ = 0, steps_ = 1, step_no_ = 0, T_ = 1;
  bool wide_ = false;  // the next step has real_rows_
  const GenerateOptions& opts_;
  std::vector<GenerationResult>& out_;
  std::vector<int32_t> toks_;  // this step's draws
  GenerateStats& st_;
  int64_t& done_;
  int64_t total_;
  std::vector<int32_t> ids_, pos_, real_rows_;
  std::vector<int64_t> len_, ended_;  // each slot's prompt length; slots ended since take_ended()
  std::vector<Sampler> samplers_;
  std::vector<bool> finished_;
};

std::vector<size_t> iota_from(size_t first, size_t count) {
  std::vector<size_t> v(count);
  std::iota(v.begin(), v.end(), first);
  return v;
}

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

// A refill step computes T rows for every slot (T: the longest joining prompt), so it waits until
// 1 / kRefillWhenFree of the slots can use it. On SmolLM2-135M on 2 CPU cores with chat prompts
// of about 30 tokens (bench/continuous.sh), a quarter gave 1.53-1.55x static batches, a half 1.47x.
constexpr int64_t kRefillWhenFree = 4;

// Continuous batching from request `next` on: one batch whose ended slots take the requests
// that follow, in a refill step once a quarter of its slots are free (or none runs), so a
// sequence that ends early does not leave its slot idle until the batch ends. The batch is
// sized for every request it may take: rows for the longest prompt, room for the longest
// prompt + max_new_tokens. Returns the first request not taken: requests.size(), unless the
// runner cannot rewind (can_rewind()), when the batch runs to its end as a static one.
size_t run_continuous(StepRunner& run, const std::vector<GenerationRequest>& reqs, size_t next,
                      const GenerateOptions& opts, std::vector<GenerationResult>& out, GenerateStats& st,
                      int64_t& done, int64_t total) {
  const ModelConfig& c = run.config();
  int64_t rows = 0, cap = 0;
  for (size_t r = next; r < reqs.size(); ++r) {
    const int64_t p = int64_t(reqs[r].prompt_ids.size());
    rows = std::max(rows, p);
    cap = std::max(cap, p + std::max<int64_t>(room_for(reqs[r], c), 1));
  }
  const size_t count = std::min(reqs.size() - next, size_t(run.max_batch()));
  BatchRun b(c, reqs, iota_from(next, count), opts, out, st, done, total, rows, cap);
  next += count;
  ++st.batches;
  run.begin_batch(b.batch(), b.capacity());
  std::vector<float> logits;
  bool more = true, can = false;
  for (bool first = true; more; first = false) {
    auto t0 = Clock::now();
    const bool prompts = b.prefill();
    run.expect_more_steps(b.more_after_next() || (can && next < reqs.size()));
    run.step(b.ids(), b.positions(), b.T(), b.real_rows(), logits);
    (prompts ? st.prefill_seconds : st.decode_seconds) += seconds_since(t0);
    t0 = Clock::now();
    if (first) {
      can = st.continuous = run.can_rewind();
      st.peak_kv_bytes = std::max(st.peak_kv_bytes, run.kv_bytes());
    }
    more = b.consume(logits);
    if (can) {
      for (int64_t slot : b.take_ended()) run.rewind(slot, 0);  // an ended slot rides along from an empty cache
      const std::vector<int64_t> free = b.free_slots();
      if (next < reqs.size() && (kRefillWhenFree * int64_t(free.size()) >= b.batch() || !more)) {
        std::vector<std::pair<int64_t, size_t>> joins;
        for (size_t i = 0; i < free.size() && next < reqs.size(); ++next) {
          if (ends_at_once(reqs[next], c)) finish(next, out, opts);
          else joins.emplace_back(free[i++], next);
        }
        if (!joins.empty()) {
          for (const auto& [slot, len] : b.refill(joins)) run.rewind(slot, len);
          ++st.refills;
          st.refilled_sequences += int64_t(joins.size());
          more = true;
        }
      }
    }
    st.decode_seconds += seconds_since(t0);
    if (more && stop_requested(opts)) {  // every token sampled so far is kept; unfinished ones are dropped
      st.interrupted = true;
      break;
    }
  }
  return next;
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
  size_t first = 0;
  if (opts.continuous && requests.size() > size_t(batch) && !stop_requested(opts))
    first = run_continuous(runner, requests, 0, opts, out, st, done, total);
  for (; first < requests.size() && !st.interrupted; first += size_t(batch)) {
    if (stop_requested(opts)) {
      st.interrupted = true;
      break;
    }
    const size_t count = std::min(requests.size() - first, size_t(batch));
    BatchRun b(runner.config(), requests, iota_from(first, count), opts, out, st, done, total);
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
    slot[size_t(g)] =
        std::make_unique<BatchRun>(runner.config(), requests, iota_from(next, count), opts, out, st, done, total);
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
