// Continuous batching (GenerateOptions::continuous): one batch whose slots, as their sequences
// end, take the requests that follow and those GenerateOptions::more brings while it runs.
#include <deque>

#include "engine/batch_run.h"

namespace flexh2o::detail {
namespace {

// A refill step computes T rows for every slot (T: the longest joining prompt), so it waits until
// 1 / kRefillWhenFree of the slots can use it. On SmolLM2-135M on 2 CPU cores with chat prompts
// of about 30 tokens (bench/continuous.sh), a quarter gave 1.53-1.55x static batches, a half 1.47x.
constexpr int64_t kRefillWhenFree = 4;

using Reqs = std::deque<GenerationRequest>;  // grows (more) without moving what BatchRun reads
using Outs = std::deque<GenerationResult>;   // ... nor the results on_result handed out

// Requests from opts.more that fit the running batch, appended to reqs / out (validated).
void take_more(const GenerateOptions& opts, const ModelConfig& c, size_t room, int64_t rows, int64_t cap, Reqs& reqs,
               Outs& out, int64_t& total) {
  if (!opts.more || room == 0) return;
  for (GenerationRequest& r : opts.more(room, rows, cap)) {
    validate_request(r, c);
    FH_CHECK(int64_t(r.prompt_ids.size()) <= rows && int64_t(r.prompt_ids.size()) + room_for(r, c) <= cap,
             "GenerateOptions::more gave a request longer than the running batch's ", rows, " rows / ", cap,
             " slots");
    total += r.max_new_tokens;
    reqs.push_back(std::move(r));
    out.emplace_back();
  }
}

// The batch from request `next` on, sized for every request it may take: rows for the longest
// prompt, room for the longest prompt + max_new_tokens (at least opts.min_rows / min_capacity,
// for requests still to come). Ended slots take the requests that follow, in a refill step once
// a quarter of the slots are free (or none runs). Returns the first request not taken:
// reqs.size(), unless the runner cannot rewind (can_rewind()), when the batch runs to its end as
// a static one.
size_t run_continuous(StepRunner& run, Reqs& reqs, size_t next, const GenerateOptions& opts, Outs& out,
                      GenerateStats& st, int64_t& done, int64_t& total) {
  const ModelConfig& c = run.config();
  const std::pair<int64_t, int64_t> extent = continuous_extent(c, reqs, next, opts.min_rows, opts.min_capacity);
  int64_t rows = extent.first, cap = extent.second;
  const size_t count = std::min(reqs.size() - next, size_t(run.max_batch()));
  // The batch holds what there is now: requests from opts.more take the slots that free. (Empty
  // slots waiting for them would cost a row each every step: on the CPU device a lone request
  // in a server's batch of 16 ran at a quarter of its speed.)
  BatchRun<Reqs, Outs> b(c, reqs, iota_from(next, count), opts, out, st, done, total, rows, cap);
  next += count;
  ++st.batches;
  run.begin_batch(b.batch(), b.capacity());
  // The prefill is as wide as the batch's own prompts; refill steps may be wider, up to rows.
  rows = b.max_rows();
  run.reserve_rows(rows);
  cap = b.capacity();
  std::vector<float> logits;
  bool more = true, can = false;
  st.continuous = run.rewinds(b.capacity());  // what the first step confirms (a stop may end it)
  for (bool first = true; more; first = false) {
    StepTimer t(st);
    const bool prompts = b.prefill();
    run.expect_more_steps(b.more_after_next() || (can && next < reqs.size()));
    if (!ran_whole(st, t, prompts, [&] { run.step(b.ids(), b.positions(), b.T(), b.real_rows(), logits); }))
      break;
    (prompts ? st.prefill_seconds : st.decode_seconds) += t.seconds();
    t.start();
    if (first) {
      can = st.continuous = run.can_rewind();
      st.peak_kv_bytes = std::max(st.peak_kv_bytes, run.kv_bytes());
    }
    more = b.consume(logits);
    if (can) {
      for (int64_t slot : b.take_ended()) run.rewind(slot, 0);  // an ended slot rides along from an empty cache
      const std::vector<int64_t> free = b.free_slots();
      if (next == reqs.size()) take_more(opts, c, free.size(), rows, cap, reqs, out, total);
      if (next < reqs.size() && (kRefillWhenFree * int64_t(free.size()) >= b.batch() || !more)) {
        std::vector<std::pair<int64_t, size_t>> joins;
        for (size_t i = 0; i < free.size() && next < reqs.size(); ++next) {
          if (ends_at_once(reqs[next], c)) finish(next, out, opts, st);
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
    st.decode_seconds += t.seconds();
    if (more && stop_requested(opts)) {  // every token sampled so far is kept; unfinished ones are dropped
      st.interrupted = true;
      break;
    }
  }
  return next;
}

}  // namespace

std::vector<GenerationResult> generate_continuous(StepRunner& runner, const std::vector<GenerationRequest>& requests,
                                                  const GenerateOptions& opts, GenerateStats& st, int64_t total) {
  Reqs reqs(requests.begin(), requests.end());
  Outs out(requests.size());
  int64_t done = 0;
  size_t first = 0;
  if (!stop_requested(opts) && (!reqs.empty() || opts.more)) {
    if (reqs.empty()) take_more(opts, runner.config(), size_t(runner.max_batch()), opts.min_rows, opts.min_capacity,
                                reqs, out, total);
    if (!reqs.empty()) first = run_continuous(runner, reqs, 0, opts, out, st, done, total);
  }
  const size_t batch = size_t(runner.max_batch());
  check_static_batches(runner, reqs, first);
  for (; first < reqs.size() && !st.interrupted; first += batch) {  // a runner that cannot rewind
    if (stop_requested(opts)) {
      st.interrupted = true;
      break;
    }
    const size_t count = std::min(reqs.size() - first, batch);
    BatchRun<Reqs, Outs> b(runner.config(), reqs, iota_from(first, count), opts, out, st, done, total);
    run_batch(runner, b, st, opts, first + count >= reqs.size());
    ++st.batches;
  }
  return std::vector<GenerationResult>(std::make_move_iterator(out.begin()), std::make_move_iterator(out.end()));
}

}  // namespace flexh2o::detail
