// The generation drivers' shared parts (generate.cpp: static batches and groups;
// generate_continuous.cpp: continuous batching): one batch's step inputs, sampling, stopping and
// results (BatchRun), over any indexable containers of requests and results. Internal to the
// engine module; not thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <numeric>
#include <utility>
#include <vector>

#include <tbb/parallel_for.h>

#include "core/error.h"
#include "engine/generate.h"

namespace flexh2o::detail {

using Clock = std::chrono::steady_clock;
inline bool stop_requested(const GenerateOptions& o) { return o.stop && o.stop->load(std::memory_order_relaxed); }
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A request that ends before its first token (max_new_tokens 0, or no room left in the model's
// positions): it takes no slot.
inline bool ends_at_once(const GenerationRequest& r, const ModelConfig& c) {
  return r.max_new_tokens == 0 || int64_t(r.prompt_ids.size()) >= max_sequence_tokens(c);
}

// The tokens a request may still add: its max_new_tokens within the model's positions.
inline int64_t room_for(const GenerationRequest& r, const ModelConfig& c) {
  return std::min(r.max_new_tokens, max_sequence_tokens(c) - int64_t(r.prompt_ids.size()));
}

// What sizes a batch of `members`: its first step's rows (the longest prompt, at least
// min_rows), the tokens a sequence may hold (at least min_capacity) and its decode steps.
struct BatchExtent {
  int64_t first_rows = 0, rows = 0, capacity = 0, steps = 1;
};
template <class Reqs>
BatchExtent batch_extent(const ModelConfig& c, const Reqs& reqs, const std::vector<size_t>& members,
                         int64_t min_rows = 0, int64_t min_capacity = 0) {
  BatchExtent x;
  int64_t max_new = 0;
  for (size_t r : members) {
    x.first_rows = std::max<int64_t>(x.first_rows, int64_t(reqs[r].prompt_ids.size()));
    max_new = std::max<int64_t>(max_new, room_for(reqs[r], c));  // a sequence cannot grow past the positions
  }
  x.rows = std::max(x.first_rows, min_rows);
  x.capacity = std::max(x.rows + std::max<int64_t>(max_new, 1), min_capacity);
  x.steps = std::max<int64_t>(max_new, 1);
  return x;
}

// A continuous batch's slots take any request from `next` on: rows for the longest prompt, room
// for the longest prompt + its tokens (at least min_rows / min_capacity, within the positions).
template <class Reqs>
std::pair<int64_t, int64_t> continuous_extent(const ModelConfig& c, const Reqs& reqs, size_t next, int64_t min_rows,
                                              int64_t min_capacity) {
  int64_t rows = std::min(min_rows, c.max_positions), cap = std::min(min_capacity, c.max_positions);
  for (size_t r = next; r < reqs.size(); ++r) {
    const int64_t p = int64_t(reqs[r].prompt_ids.size());
    rows = std::max(rows, p);
    cap = std::max(cap, p + std::max<int64_t>(room_for(reqs[r], c), 1));
  }
  return {rows, cap};
}

// StepRunner::check_batch of a batch of `members`, sized as BatchRun sizes it; returns that size.
template <class Reqs>
BatchExtent check_members(const StepRunner& runner, const Reqs& reqs, const std::vector<size_t>& members,
                          int64_t min_rows = 0, int64_t min_capacity = 0) {
  const BatchExtent x = batch_extent(runner.config(), reqs, members, min_rows, min_capacity);
  std::vector<int64_t> lengths;
  for (size_t r : members) lengths.push_back(std::max<int64_t>(int64_t(reqs[r].prompt_ids.size()), 1));
  runner.check_batch(lengths, x.rows, x.capacity);
  return x;
}

inline std::vector<size_t> iota_from(size_t first, size_t count) {
  std::vector<size_t> v(count);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// The static batches of requests first.. (max_batch() at a time), each checked.
template <class Reqs>
void check_static_batches(const StepRunner& runner, const Reqs& reqs, size_t first) {
  const size_t batch = size_t(runner.max_batch());
  for (; first < reqs.size(); first += batch)
    check_members(runner, reqs, iota_from(first, std::min(reqs.size() - first, batch)));
}

// Runs a caller's callback (on_result, on_progress), counting its time in st.output_seconds.
template <class F>
void call_out(GenerateStats& st, F&& f) {
  const auto t0 = Clock::now();
  f();
  st.output_seconds += seconds_since(t0);
}

template <class Outs>
void finish(size_t r, Outs& out, const GenerateOptions& opts, GenerateStats& st) {
  out[r].finished = true;
  if (opts.on_result) call_out(st, [&] { opts.on_result(r, out[r]); });
}

// The seconds since start() less the time the caller's callbacks took meanwhile (call_out()).
class StepTimer {
 public:
  explicit StepTimer(const GenerateStats& st) : st_(st) { start(); }
  void start() {
    t0_ = Clock::now();
    output0_ = st_.output_seconds;
  }
  double seconds() const { return seconds_since(t0_) - (st_.output_seconds - output0_); }

 private:
  const GenerateStats& st_;
  Clock::time_point t0_;
  double output0_ = 0;
};

// One batch from its padded prompt to its last token: the step inputs it needs next and what
// each step's logits mean (sampling, stopping, results). Slot b holds request members[b]; under
// continuous batching a slot whose sequence ended takes another request (refill()). Both
// drivers run batches through it.
template <class Reqs, class Outs>
class BatchRun {
 public:
  // The first step is the prompts, left-padded to the longest. A continuous run sizes the batch
  // for every request it may take: refill steps up to `min_rows` rows (max_rows()), room for
  // `min_capacity` tokens a slot.
  BatchRun(const ModelConfig& c, const Reqs& reqs, std::vector<size_t> members, const GenerateOptions& opts,
           Outs& out, GenerateStats& st, int64_t& done_tokens, const int64_t& total_tokens, int64_t min_rows = 0,
           int64_t min_capacity = 0)
      : c_(c), reqs_(reqs), idx_(std::move(members)), B_(int64_t(idx_.size())), opts_(opts), out_(out), st_(st),
        done_(done_tokens), total_(total_tokens) {
    const BatchExtent x = batch_extent(c, reqs, idx_, min_rows, min_capacity);
    const int64_t first_rows = x.first_rows;
    S_ = x.rows;
    capacity_ = x.capacity;
    steps_ = x.steps;
    len_.assign(size_t(B_), 0);
    finished_.assign(size_t(B_), false);
    samplers_.reserve(size_t(B_));
    std::vector<std::pair<int64_t, size_t>> all;
    for (int64_t b = 0; b < B_; ++b) {
      samplers_.emplace_back(reqs[idx_[size_t(b)]].sampling);
      all.emplace_back(b, idx_[size_t(b)]);
    }
    ids_.assign(size_t(B_), opts.pad_id);  // no sequence has a pending token yet
    pos_.assign(size_t(B_), 0);
    wide_step(all, std::max<int64_t>(first_rows, 1), nullptr);
    for (const auto& [b, r] : all)
      if (ends_at_once(reqs[r], c)) end_now(b);
  }

  int64_t batch() const { return B_; }
  int64_t capacity() const { return capacity_; }
  // The widest step this batch may take (its refill steps'): StepRunner::reserve_rows().
  int64_t max_rows() const { return S_; }
  // The next step processes prompts: the prefill, or a refill's step.
  bool prefill() const { return T_ > 1 || step_no_ == 0; }
  const int32_t* ids() const { return ids_.data(); }
  const int32_t* positions() const { return pos_.data(); }
  int64_t T() const { return T_; }
  const int32_t* real_rows() const { return wide_ ? real_rows_.data() : nullptr; }
  // Whether a step after the next one is expected without EOS (an engine's prefetch hint).
  bool more_after_next() const { return step_no_ + 1 < steps_; }
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
    const bool decode_step = !prefill();  // as the drivers time it
    if (step_no_++ > 0 && decode_step) ++st_.decode_steps;  // refill steps are timed as prefill
    // Prompt tokens count once their step ran: a stop midway (StepStopped) prefilled none.
    st_.prompt_tokens += std::exchange(step_prompt_tokens_, 0);
    st_.padded_prompt_tokens += std::exchange(step_padded_tokens_, 0);
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
      if (decode_step) ++st_.decode_tokens;
      ++done_;
      const bool eos = !opts_.ignore_eos && std::ranges::find(opts_.eos_ids, tok) != opts_.eos_ids.end();
      const int64_t total_len = len_[bi] + int64_t(res.tokens.size());
      const bool length = int64_t(res.tokens.size()) >= r.max_new_tokens || total_len >= max_sequence_tokens(c_);
      // A stop string that the last allowed token completes is a stop, as vLLM checks stops first:
      // the text is cut there, and finish_reason must say why.
      const bool stopped = !eos && opts_.ends_at && opts_.ends_at(idx_[bi], res);
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
    if (opts_.on_progress) call_out(st_, [&] { opts_.on_progress(done_, total_); });
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
      step_prompt_tokens_ += int64_t(p.size());
    }
    step_padded_tokens_ = B_ * T;
    ids_ = std::move(ids);
    pos_ = std::move(pos);
    T_ = T;
    wide_ = true;
  }

  void end_now(int64_t b) {
    finished_[size_t(b)] = true;
    ended_.push_back(b);
    finish(idx_[size_t(b)], out_, opts_, st_);
  }

  const ModelConfig& c_;
  const Reqs& reqs_;
  std::vector<size_t> idx_;  // the request in each slot
  int64_t B_, S_ = 0, capacity_ = 0, steps_ = 1, step_no_ = 0, T_ = 1;
  bool wide_ = false;  // the next step has real_rows_
  const GenerateOptions& opts_;
  Outs& out_;
  std::vector<int32_t> toks_;  // this step's draws
  GenerateStats& st_;
  int64_t& done_;
  const int64_t& total_;  // grows as a continuous run takes more requests
  std::vector<int32_t> ids_, pos_, real_rows_;
  std::vector<int64_t> len_, ended_;  // each slot's prompt length; slots ended since take_ended()
  int64_t step_prompt_tokens_ = 0, step_padded_tokens_ = 0;  // of the next step's prompts (consume() counts)
  std::vector<Sampler> samplers_;
  std::vector<bool> finished_;
};

// Runs `step` (a StepRunner step of a generation driver, under StepStopScope): true when it ran
// to its end; false when a stop ended it (StepStopped): the run is then interrupted.
template <class F>
bool ran_whole(GenerateStats& st, StepTimer& t, bool prefill, F&& step) {
  try {
    step();
    return true;
  } catch (const StepStopped&) {
    st.interrupted = true;
    (prefill ? st.prefill_seconds : st.decode_seconds) += t.seconds();
    return false;
  }
}

template <class B>
void run_batch(StepRunner& run, B& b, GenerateStats& st, const GenerateOptions& opts, bool last_batch) {
  run.begin_batch(b.batch(), b.capacity());
  std::vector<float> logits;
  StepTimer t(st);
  bool more = true;
  while (more) {
    const bool prefill = b.prefill();
    run.expect_more_steps(b.more_after_next() || !last_batch);
    if (!ran_whole(st, t, prefill, [&] { run.step(b.ids(), b.positions(), b.T(), b.real_rows(), logits); }))
      return;
    if (prefill) {
      st.prefill_seconds += t.seconds();
      st.peak_kv_bytes = std::max(st.peak_kv_bytes, run.kv_bytes());
      t.start();
    }
    more = b.consume(logits);
    if (more && stop_requested(opts)) {  // every token sampled so far is kept; unfinished ones are dropped
      st.interrupted = true;
      break;
    }
  }
  st.decode_seconds += t.seconds();
}

// Continuous batching (generate_continuous.cpp): `requests` (validated; `total` their
// max_new_tokens) and any GenerateOptions::more brings, in one batch whose ended slots take the
// next requests; static batches for the rest where the runner cannot rewind.
std::vector<GenerationResult> generate_continuous(StepRunner& runner, const std::vector<GenerationRequest>& requests,
                                                  const GenerateOptions& opts, GenerateStats& st, int64_t total);

}  // namespace flexh2o::detail
